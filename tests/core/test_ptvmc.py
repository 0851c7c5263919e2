"""Projected tVMC (runner.core.ptvmc): the control-variate infidelity and its gradient against dense
vectors over every configuration, the Monte Carlo estimate against the same, one step against the
exact midpoint step, and the integrator's keys refused before anything compiles."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from runner.config.build import build
from runner.core import ptvmc
from runner.core.problem import draw
from runner.core.sampler import init_chains
from runner.errors import ConfigError
from runner.physics import hilbert as hb
from tests.helpers.config import compose_config
from tests.helpers.dense import basis_index, dense_ising

L, FIELD, DT = 4, 0.5, 0.05


def _problem(sampler="full_sum", extra=()):
    config = compose_config(["task=dynamics", "task/integrator=ptvmc", f"hilbert.L={L}", f"hamiltonian.h={FIELD}",
                             "model=jastrow", "dtype=complex128", f"sampler={sampler}", *extra])
    return build(config).problem


def _params(problem, scale, seed):
    """Jastrow couplings scale * (complex normal)."""
    params = problem.model.init(jax.random.PRNGKey(0), jnp.ones((L,), jnp.int8))["params"]
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map(lambda x: jnp.asarray(scale * (rng.standard_normal(x.shape)
                                                                  + 1j * rng.standard_normal(x.shape))), params)


def _dense_psi(problem, params):
    states = hb.all_states(hb.chain(L))
    psi = np.zeros(2**L, complex)
    psi[basis_index(states)] = np.exp(np.asarray(problem.logpsi(params, jnp.asarray(states))))
    return psi


def _dense_infidelity(problem, phi, theta, coefficient):
    """1 - |<Phi|Psi>|^2 / (<Phi|Phi> <Psi|Psi>), Phi = (1 + c H) psi_phi, Psi = (1 - c H) psi_theta."""
    H = dense_ising(hb.chain(L).bonds, L, 1.0, FIELD)
    Phi = _dense_psi(problem, phi) + coefficient * (H @ _dense_psi(problem, phi))
    Psi = _dense_psi(problem, theta) - coefficient * (H @ _dense_psi(problem, theta))
    return 1 - abs(np.vdot(Phi, Psi)) ** 2 / (np.vdot(Phi, Phi).real * np.vdot(Psi, Psi).real)


def _target(problem, theta, coefficient, seed=0):
    """(chains, the step's target on one draw of |psi_theta|^2) from fresh chains."""
    chains = init_chains(problem.sampler, seed)
    chains, sigma_y, w_y, _ = draw(problem, theta, chains)
    return chains, ptvmc.target(problem, theta, coefficient, sigma_y, w_y)


def _estimator(problem, coefficient, seed=0):
    """(phi, theta) -> `ptvmc.Estimate` from one draw of |psi_theta|^2 and one of |psi_phi|^2, jitted."""
    method = ptvmc.ptvmc(DT)

    @jax.jit
    def run(phi, theta):
        chains, psi = _target(problem, theta, coefficient, seed)
        _, sigma_x, w_x, _ = draw(problem, phi, chains)
        return ptvmc.estimate(problem, method, phi, theta, (sigma_x, w_x), psi)

    return run


@pytest.mark.parametrize("real_time", [True, False])
def test_full_sum_infidelity_and_gradient_are_the_dense_ones(real_time):
    """TFIM chain L = 4, complex Jastrow, full sum: at phi a random point near theta the estimate of
    I equals the dense infidelity to 1e-10, and its gradient dI/dRe + i dI/dIm equals the dense
    central differences (step 1e-5) of I to 1e-7."""
    problem = _problem()
    theta, phi = _params(problem, 0.1, 1), _params(problem, 0.1, 2)
    coefficient = (1j if real_time else 1.0) * DT / 2
    found = _estimator(problem, coefficient)(phi, theta)
    exact = _dense_infidelity(problem, phi, theta, coefficient)
    assert 1e-3 < exact < 0.5
    assert abs(float(found.infidelity) - exact) < 1e-10
    flat = np.asarray(phi["pair_coupling"])
    numeric = np.zeros(flat.shape, complex)
    for k in range(flat.size):
        for unit in (1.0, 1j):
            shifted = [flat.copy(), flat.copy()]
            shifted[0][k] += 1e-5 * unit
            shifted[1][k] -= 1e-5 * unit
            up, down = (_dense_infidelity(problem, {"pair_coupling": jnp.asarray(s)}, theta, coefficient)
                        for s in shifted)
            numeric[k] += (up - down) / 2e-5 * unit
    np.testing.assert_allclose(np.asarray(found.gradient["pair_coupling"]), numeric, atol=1e-7)


def test_natural_gradient_updates_converge_to_the_ansatz_floor():
    """From theta, full updates (learning rate 1, the Gauss-Newton step) of one step: the dense
    infidelity falls from dt^2 Var(H)-like 1e-2 by more than 1e5 in four updates and stays there
    (the fifth to eighth change it by less than 1e-12: the ansatz's floor), and the estimate agrees."""
    problem = _problem()
    theta = _params(problem, 0.1, 1)
    coefficient = 1j * DT / 2
    estimate = _estimator(problem, coefficient)
    phi, dense = theta, []
    for _ in range(8):
        found = estimate(phi, theta)
        dense.append(_dense_infidelity(problem, phi, theta, coefficient))
        assert abs(float(found.infidelity) - dense[-1]) < 1e-10
        phi = jax.tree_util.tree_map(lambda p, d: p + d, phi, found.step)
    assert dense[0] > 1e-3 and dense[4] < 1e-5 * dense[0], dense
    assert max(dense[4:]) - min(dense[4:]) < 1e-12, dense


def _optimised(problem, method, theta, coefficient):
    """`ptvmc._optimise` of one step from theta (the full sum's draw), jitted: (phi, updates, infidelity, converged)."""
    @jax.jit
    def run(theta):
        chains, psi = _target(problem, theta, coefficient)
        phi, _, n, infidelity, converged = ptvmc._optimise(problem, method, theta, theta, chains, psi)
        return phi, n, infidelity, converged

    return run(theta)


def test_an_update_that_raises_the_infidelity_is_undone():
    """Updates three times the Gauss-Newton step overshoot (the error is multiplied by -2 per
    update near the minimum): the first update raises the infidelity, so it is undone and the
    step ends at its start, converged, with that start's infidelity (the dense one); at the
    Gauss-Newton step (learning rate 1) the same step converges far below it."""
    problem = _problem()
    theta = _params(problem, 0.1, 1)
    coefficient = 1j * DT / 2
    start = _dense_infidelity(problem, theta, theta, coefficient)
    phi, n, infidelity, converged = _optimised(problem, ptvmc.ptvmc(DT, learning_rate=3.0), theta, coefficient)
    assert bool(converged) and int(n) == 1
    np.testing.assert_array_equal(np.asarray(phi["pair_coupling"]), np.asarray(theta["pair_coupling"]))
    assert abs(float(infidelity) - start) < 1e-10
    phi, n, infidelity, converged = _optimised(problem, ptvmc.ptvmc(DT), theta, coefficient)
    assert bool(converged) and float(infidelity) < 1e-5 * start
    assert abs(_dense_infidelity(problem, phi, theta, coefficient) - float(infidelity)) < 1e-10


@pytest.mark.parametrize("override,key", [
    ("task.integrator.max_iterations=0", "task.integrator.max_iterations"),
    ("task.integrator.dt=0", "task.integrator.dt"),
    ("task.integrator.tolerance=-1", "task.integrator.tolerance"),
    ("task.integrator.learning_rate=0", "task.integrator.learning_rate"),
    ("task.integrator.rcond=1", "task.integrator.rcond"),
    ("task.integrator.extrapolate=maybe", "task.integrator.extrapolate"),
])
def test_bad_keys_name_their_key(override, key):
    with pytest.raises(ConfigError) as err:
        build(compose_config(["task=dynamics", "task/integrator=ptvmc", override]))
    assert err.value.key == key


def test_composes_and_builds():
    task = build(compose_config(["task=dynamics", "task/integrator=ptvmc"])).settings.task
    assert task.integrator == ptvmc.ptvmc(0.01, max_iterations=10, tolerance=1e-9, learning_rate=1.0,
                                          diag_shift=0.0, rcond=1e-8, extrapolate=True)
