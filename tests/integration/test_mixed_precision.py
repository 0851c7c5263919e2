"""dtype=float32_mixed / complex64_mixed: 32-bit model, samples, local energies and log-derivatives,
64-bit dense SR and minSR solves (runner.core.precond.solving_in), checked against full float64."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from runner import app
from runner.config.build import build
from runner.core import precond
from runner.core.jacobian import jacobian
from runner.core.local_energy import local_energies
from runner.core.precond_types import from_dense
from runner.core.sampler import sample
from runner.core.sr import CGState
from runner.core.vmc import init_state
from runner.core.wavefunction import gradient_mode
from runner.parallel import mesh
from tests.helpers.config import compose_config

CASES = {  # real parameters on the TFIM chain; complex (holomorphic) ones on the Heisenberg chain
    "float32_mixed": ["hilbert.L=8", "hamiltonian.h=1.0"],
    "complex64_mixed": ["hilbert.L=8", "hamiltonian=heisenberg", "hilbert.total_sz=0", "sampler=metropolis_exchange"],
}


def relative(x, y):
    return float(np.linalg.norm(np.asarray(x) - np.asarray(y)) / np.linalg.norm(np.asarray(y)))


def one_batch(dtype, preconditioner="sr", extra=()):
    """The built problem, its initial state and the pieces of one step: samples, E_loc, Jacobian."""
    config = compose_config([*CASES[dtype], f"dtype={dtype}", "sampler.n_samples=512", "sampler.n_chains=16",
                             f"preconditioner={preconditioner}", *extra])
    problem = build(config).problem
    state = init_state(problem, 0, jnp.ones(8, jnp.int8))
    _, sigma, _ = sample(problem.sampler, problem.amplitude, state.params, state.chains)
    eloc = local_energies(problem, state.params, sigma)
    eps = (eloc.reshape(-1) - jnp.mean(eloc)) / jnp.sqrt(eloc.size)
    mode = gradient_mode(state.params, problem.model)
    return problem, state, eps, jacobian(problem, state.params, sigma, mode), mode


@pytest.mark.parametrize("dtype", list(CASES))
def test_the_model_side_stays_32_bit(dtype):
    problem, state, eps, jac, _ = one_batch(dtype)
    low = {"float32_mixed": jnp.float32, "complex64_mixed": jnp.complex64}[dtype]
    assert all(leaf.dtype == low for leaf in jax.tree_util.tree_leaves(state.params))
    assert jac.dense().dtype == low and eps.dtype == low  # log-derivatives and local energies


@pytest.mark.parametrize("dtype", list(CASES))
@pytest.mark.parametrize("shift", [1e-2, 1e-4])
def test_the_dense_sr_solve_is_the_float64_solve_of_the_32_bit_jacobian(dtype, shift):
    """Mixed precision's SR direction equals the float64 solve of the same float32 Obar and eps
    (to 1e-10); the all-float32 solve is far off (the Gram matrix's condition number times
    float32's 1e-7)."""
    _, state, eps, jac, mode = one_batch(dtype)
    Obar = jac.dense()
    sr = precond.sr(diag_shift=shift, solver="cholesky")
    mixed = precond.solving_in(sr, jnp.float64)(from_dense(Obar, mode), eps, mode)
    wide = {"float32_mixed": jnp.float64, "complex64_mixed": jnp.complex128}[dtype]
    exact = sr(from_dense(Obar.astype(wide), mode), eps.astype(wide), mode)
    single = sr(from_dense(Obar, mode), eps, mode)
    assert mixed.dtype == wide and single.dtype == Obar.dtype
    assert relative(mixed, exact) < 1e-10
    assert relative(single, exact) > 1e3 * max(relative(mixed, exact), 1e-16)
    # and as the VMC step runs it: the built preconditioner of dtype=*_mixed
    problem = one_batch(dtype, extra=["preconditioner.solver=cholesky", f"preconditioner.diag_shift={shift}"])[0]
    in_step = problem.precondition.update(from_dense(Obar, mode), eps, mode, ())[0]
    np.testing.assert_array_equal(np.asarray(in_step), np.asarray(mixed))


@pytest.mark.parametrize("dtype", list(CASES))
def test_the_minsr_kernel_and_solve_are_64_bit(dtype):
    """minSR on the step's own Jacobian (kernel from its sample chunks, promoted): close to the
    float64 solve of the float32 Jacobian, far closer than the float32 solve. The last product
    x = Obar^H y uses the Jacobian's 32-bit products, so the agreement is float32's, not 1e-10."""
    _, _, eps, jac, mode = one_batch(dtype, "minsr")
    Obar = jac.dense()
    solver = precond.minsr(diag_shift=1e-4)
    wide = {"float32_mixed": jnp.float64, "complex64_mixed": jnp.complex128}[dtype]
    exact = solver(from_dense(Obar.astype(wide), mode), eps.astype(wide), mode)
    mixed = precond.solving_in(solver, jnp.float64)(jac, eps, mode)
    single = solver(jac, eps, mode)
    assert relative(mixed, exact) < 1e-5
    assert relative(single, exact) > 30 * relative(mixed, exact)
    # with a dense Jacobian the last product is 64-bit too
    dense_mixed = precond.solving_in(solver, jnp.float64)(from_dense(Obar, mode), eps, mode)
    assert relative(dense_mixed, exact) < 1e-10


def test_cg_is_left_in_the_parameters_precision():
    """CG's products with O run in 32-bit: solving_in passes it through unchanged (same bits)."""
    problem, state, eps, jac, mode = one_batch("float32_mixed", extra=["preconditioner.solver=cg"])
    assert isinstance(state.solver, CGState) and state.solver.x0.dtype == jnp.float32
    plain = precond.sr(solver="cg")
    x, new, _ = problem.precondition.update(jac, eps, mode, state.solver)
    x_plain, new_plain, _ = plain.update(jac, eps, mode, state.solver)
    assert x.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(x), np.asarray(x_plain))
    np.testing.assert_array_equal(np.asarray(new.x0), np.asarray(new_plain.x0))


@pytest.mark.parametrize("case", ["tfim", "heisenberg"])
def test_a_short_run_reaches_the_float64_energy(case, tmp_path):
    """80 steps of each dtype from the same seed: the mixed run's final energy agrees with the
    float64 and float32 runs' within error bars, and all are near the exact energy."""
    base = (["hilbert.L=8", "hamiltonian.h=1.0"] if case == "tfim" else
            ["hilbert.L=8", "hamiltonian=heisenberg", "hilbert.total_sz=0", "sampler=metropolis_exchange"])
    dtypes = ["float64", "float32", "float32_mixed"] if case == "tfim" else ["complex128", "complex64", "complex64_mixed"]
    summaries = {}
    for dtype in dtypes:
        config = compose_config([*base, f"dtype={dtype}", "n_iter=80", "sampler.n_samples=512", "sampler.n_chains=16",
                                 "final_rounds=4", "exact=true", "checkpoint_every=1000", "preconditioner.solver=cholesky",
                                 "optimizer.learning_rate=0.05"])
        summaries[dtype] = app.execute(build(config), mesh.make_mesh("single"), tmp_path / dtype)
    mixed = summaries[dtypes[2]]
    for other in dtypes[:2]:
        gap = abs(mixed["energy"] - summaries[other]["energy"])
        bar = np.hypot(mixed["energy_error"], summaries[other]["energy_error"])
        assert gap < 4 * bar + 1e-3 * abs(mixed["exact_energy"]), (other, summaries[other], mixed)
    for summary in summaries.values():
        assert summary["relative_error"] < 0.02, summary
