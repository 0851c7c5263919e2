"""The TDVP against dense references: the projected tangent vector and the residual from d psi /
d theta over all configurations, the signal-to-noise ratios from the samples' own contributions,
and an rk4 evolution of a product state against exact evolution."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.flatten_util import ravel_pytree

from models import RBM
from models.common import normal
from runner.core import integrators, precond
from runner.core import sampler as smp
from runner.core.jacobian import log_derivatives
from runner.core.local_energy import local_energies
from runner.core.problem import Problem, draw
from runner.core.tdvp import TDVP, parameter_derivative, tdvp, time_derivative
from runner.core.wavefunction import from_split, gradient_mode, to_split
from runner.errors import ConfigError
from runner.physics import dynamics, hamiltonians, pauli
from runner.physics import hilbert as hb
from runner.physics.exact import expectation
from tests.helpers.dense import basis_index, dense_ising
from tests.helpers.exact import NonHolomorphic


class AmplitudePhase(nn.Module):
    """Real parameters, complex log psi: fields and `hidden` tanh units for the amplitude and the
    phase, log psi = s.a + tanh(s W) u + i (s.b + tanh(s W) v); hidden = 0 is a product state."""

    hidden: int = 2

    @nn.compact
    def __call__(self, sigma_xN):
        n = sigma_xN.shape[-1]
        x = sigma_xN.astype(jnp.float64)
        log_abs = x @ self.param("a", normal(0.3), (n,), jnp.float64)
        phase = x @ self.param("b", normal(0.3), (n,), jnp.float64)
        if self.hidden:
            h = jnp.tanh(x @ self.param("w", normal(0.3), (n, self.hidden), jnp.float64))
            log_abs = log_abs + h @ self.param("u", normal(0.5), (self.hidden,), jnp.float64)
            phase = phase + h @ self.param("v", normal(0.5), (self.hidden,), jnp.float64)
        return log_abs + 1j * phase


MODELS = {"rbm_complex": RBM(alpha=1, param_dtype=jnp.complex128), "amplitude_phase": AmplitudePhase(),
          "nonholomorphic": NonHolomorphic()}
J, H_FIELD = 1.0, 0.9


def _ising_problem(model_name, sampler_of=lambda lattice: smp.full_sum(lattice, n_chains=2), n_sites=6):
    lattice = hb.chain(n_sites)
    ham = hamiltonians.ising(lattice, J=J, h=H_FIELD)
    model = MODELS[model_name]
    params = model.init(jax.random.PRNGKey(3), jnp.ones((n_sites,), jnp.int8))["params"]
    if model_name == "rbm_complex":
        params = jax.tree_util.tree_map(lambda x: 20 * x, params)
    problem = Problem(ham, model, sampler_of(lattice), optax.sgd(0.1), precond.none())
    return lattice, problem, params


def _evaluate(problem, equation, params):
    """(theta_dot, info, sigma, w) of one jitted evaluation on the sampler's draw."""
    chains = smp.init_chains(problem.sampler, 0)

    @jax.jit
    def run(params):
        _, sigma, w, _ = draw(problem, params, chains)
        return (*parameter_derivative(problem, equation, params, sigma, w), sigma, w)

    return run(params)


def _coordinates(params, mode):
    """(theta, to_params): the flat parameters in the solver's coordinates."""
    flat, unravel = ravel_pytree(params)
    if mode == "split":
        return to_split(flat), lambda v: unravel(from_split(v))
    return flat, unravel


def _dense_projection(lattice, model, params, real_time):
    """(M, b, coordinates): the tangent vectors d psi / d theta of the normalised state with the
    component along psi removed [D, P], the exact one P(-i H psi) or P(-H psi) [D], all built
    from the dense psi over every configuration, d psi / d theta by jax.jacfwd and H from
    Kronecker products."""
    mode = gradient_mode(params, model)
    states = jnp.asarray(hb.all_states(lattice))
    theta, to_params = _coordinates(params, mode)
    psi_of = lambda v: jnp.exp(model.apply({"params": to_params(v)}, states))  # noqa: E731
    psi = np.asarray(psi_of(theta))
    T_DxP = np.asarray(jax.jacfwd(psi_of, holomorphic=mode == "holomorphic")(theta))
    norm = np.linalg.norm(psi)
    u, T_DxP = psi / norm, T_DxP / norm
    idx = basis_index(hb.all_states(lattice))
    H = dense_ising(lattice.bonds, lattice.n_sites, J, H_FIELD)[np.ix_(idx, idx)]
    project = lambda v: v - np.outer(u, u.conj() @ v) if v.ndim == 2 else v - u * np.vdot(u, v)  # noqa: E731
    return project(T_DxP), project((-1j if real_time else -1.0) * (H @ u)), mode


def _least_squares(M, b, mode):
    """argmin_x |M x - b| over complex x (holomorphic) or real x."""
    if mode == "holomorphic":
        return np.linalg.lstsq(M, b, rcond=1e-13)[0]
    return np.linalg.lstsq(np.vstack([M.real, M.imag]), np.concatenate([b.real, b.imag]), rcond=1e-13)[0]


@pytest.mark.parametrize("real_time", [True, False], ids=["real_time", "imaginary_time"])
@pytest.mark.parametrize("model_name", sorted(MODELS))
@pytest.mark.slow
def test_tangent_vector_and_residual_are_the_dense_projection(model_name, real_time):
    """With a full sum, O theta_dot is the least-squares projection of -i H psi (or -H psi) onto
    the tangent space, orthogonal to psi, and r^2 is its relative distance: both from the
    dense d psi / d theta (tangent vectors compared, not parameters: S may be singular)."""
    lattice, problem, params = _ising_problem(model_name)
    M, b, mode = _dense_projection(lattice, problem.model, params, real_time)
    x_ref = _least_squares(M, b, mode)
    residual_ref = np.linalg.norm(M @ x_ref - b) ** 2 / np.linalg.norm(b) ** 2
    assert 1e-4 < residual_ref < 0.99  # a projection that drops something, and keeps something

    theta_dot, info, _, _ = _evaluate(problem, tdvp(real_time=real_time, rcond=1e-12), params)
    x = _coordinates(theta_dot, mode)[0]
    assert x.dtype == ravel_pytree(params)[0].dtype or mode == "split"
    tangent, tangent_ref = M @ np.asarray(x), M @ x_ref
    assert np.linalg.norm(tangent - tangent_ref) <= 1e-7 * np.linalg.norm(tangent_ref)
    np.testing.assert_allclose(float(info.residual), residual_ref, atol=1e-9)
    np.testing.assert_allclose(float(info.energy.variance), np.linalg.norm(b) ** 2, rtol=1e-10)
    assert np.all(np.isinf(np.asarray(info.snr_P)))  # a full sum: no noise


def _reference_snr(problem, params, sigma, real_time):
    """SNR of rho_k from the samples, in NumPy: the samples' O and E_loc (the repo's), S and its
    eigenvectors, and per-sample estimates N r_ks of rho_k (their mean is rho_k, the standard
    error of that mean their standard deviation over sqrt(N))."""
    mode = gradient_mode(params, problem.model)
    O = np.asarray(log_derivatives(problem, params, sigma, mode)).reshape(-1, ravel_pytree(params)[0].size)
    eloc = np.asarray(local_energies(problem, params, sigma)).reshape(-1)
    n = len(eloc)
    dO, de = O - O.mean(axis=0), eloc - eloc.mean()
    g = dO.conj() * ((-1j if real_time else -1.0) * de)[:, None]  # [N, P]: per-sample O* target
    S = dO.conj().T @ dO / n
    if mode != "holomorphic":
        S, g = S.real, g.real
    _, V = np.linalg.eigh(S)
    r = g @ V.conj()  # [N, P]: per-sample contributions to rho, times N
    return np.abs(r.mean(axis=0)) / (r.std(axis=0) / np.sqrt(n))


@pytest.mark.parametrize("model_name", ["rbm_complex", "amplitude_phase"])
@pytest.mark.slow
def test_signal_to_noise_ratios_are_those_of_the_samples(model_name):
    """With samples of |psi|^2, SNR_k is |rho_k| over the standard error of the mean of the
    per-sample estimates of rho_k (a NumPy reference on the same samples). A cut-off far below
    every SNR changes nothing, one far above every SNR stops the evolution, one in between
    shortens it; the cut-off may be traced (one compilation for all three)."""
    exact = lambda lattice: smp.exact(lattice, n_samples=256, n_chains=4)  # noqa: E731
    _, problem, params = _ising_problem(model_name, exact)
    theta_dot, info, sigma, w = _evaluate(problem, tdvp(rcond=1e-10), params)
    assert w is None
    snr = np.asarray(info.snr_P)
    np.testing.assert_allclose(snr, _reference_snr(problem, params, sigma, True), rtol=1e-6)
    assert np.all(np.isfinite(snr)) and np.min(snr) < 1 < np.max(snr)

    chains = smp.init_chains(problem.sampler, 0)

    traces = []  # JAX traces once per compilation

    @jax.jit
    def cut_at(params, cutoff):
        traces.append(cutoff)
        _, sigma, w, _ = draw(problem, params, chains)
        return ravel_pytree(parameter_derivative(problem, TDVP(rcond=1e-10, snr_cutoff=cutoff), params, sigma, w)[0])[0]

    plain = np.asarray(ravel_pytree(theta_dot)[0])
    low, high, middle = (np.asarray(cut_at(params, jnp.asarray(c, jnp.float64))) for c in (1e-3 * snr.min(), 1e3 * snr.max(), 2.0))
    assert len(traces) == 1
    np.testing.assert_allclose(low, plain, rtol=1e-9, atol=1e-12)
    assert np.linalg.norm(high) < 1e-12 * np.linalg.norm(plain)
    assert 0 < np.linalg.norm(middle) < np.linalg.norm(plain)


def _product_state(model_name, n_sites):
    """A product state with site-dependent complex fields: the RBM with zero couplings and
    hidden biases (their derivatives vanish there, so they stay zero), or amplitude_phase with
    no hidden units."""
    a = np.linspace(-0.4, 0.3, n_sites)
    b = np.linspace(0.5, -0.2, n_sites)
    if model_name == "rbm_complex":
        model = RBM(alpha=1, param_dtype=jnp.complex128)
        params = model.init(jax.random.PRNGKey(0), jnp.ones((n_sites,), jnp.int8))["params"]
        params = jax.tree_util.tree_map(jnp.zeros_like, params)
        return model, {**params, "visible_bias": jnp.asarray(a + 1j * b)}
    return AmplitudePhase(hidden=0), {"a": jnp.asarray(a), "b": jnp.asarray(b)}


@pytest.mark.parametrize("model_name", ["rbm_complex", "amplitude_phase"])
@pytest.mark.slow
def test_rk4_evolution_of_a_product_state_is_exact(model_name):
    """H = -0.9 sum X - 0.4 sum Z keeps a product state a product state, which both models
    represent exactly: rk4 (dt 0.02) on the full-sum TDVP follows exp(-i H t) psi0 to its own
    accuracy (state and magnetisations), with r^2 zero along the way."""
    n_sites = 4
    lattice = hb.chain(n_sites)
    ham = hamiltonians.pauli(lattice, [{"coeff": -0.9, "ops": "X", "on": "sites"},
                                       {"coeff": -0.4, "ops": "Z", "on": "sites"}])
    model, params = _product_state(model_name, n_sites)
    problem = Problem(ham, model, smp.full_sum(lattice, n_chains=2), optax.sgd(0.1), precond.none())
    equation = tdvp(rcond=1e-12)
    f = time_derivative(problem, equation)
    integrator = integrators.rk4(0.02)
    state = integrators.init(integrator, f, 0.0, params, smp.init_chains(problem.sampler, 0))
    advance = jax.jit(lambda p, s, t_end: integrators.advance(integrator, f, p, s, t_end))

    states = jnp.asarray(hb.all_states(lattice))
    psi_of = lambda p: np.asarray(jnp.exp(model.apply({"params": p}, states)))  # noqa: E731
    times = [0.5, 1.0, 1.5]
    exact_TxD = dynamics.evolve(ham, lattice, psi_of(params), times)
    magnetisation = {name: pauli.pauli_sum(n_sites, [(1.0 / n_sites, name, (i,)) for i in range(n_sites)])
                     for name in "XYZ"}
    for t, exact in zip(times, exact_TxD):
        params, state = advance(params, state, t)
        assert float(state.t) == t
        psi = psi_of(params)
        fidelity = np.abs(np.vdot(exact, psi)) ** 2 / (np.vdot(exact, exact).real * np.vdot(psi, psi).real)
        assert 1 - fidelity < 1e-10, (t, fidelity)
        for name, op in magnetisation.items():
            np.testing.assert_allclose(expectation(op, lattice, psi), expectation(op, lattice, exact), atol=1e-7)
    _, info, _, _ = _evaluate(problem, equation, params)
    assert float(info.residual) < 1e-10


def test_refuses_bad_settings():
    with pytest.raises(ConfigError, match="diag_shift"):
        tdvp(diag_shift=-1.0)
    with pytest.raises(ConfigError, match="rcond"):
        tdvp(rcond=1.0)
    with pytest.raises(ConfigError, match="snr_cutoff"):
        tdvp(snr_cutoff=0.0)
    with pytest.raises(ConfigError, match="real_time"):
        tdvp(real_time="yes")
