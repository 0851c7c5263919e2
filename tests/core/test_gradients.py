"""Gradients, SR and minSR against exact full sums over the Hilbert space."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from runner.core import precond
from runner.core.jacobian import jacobian
from runner.core.local_energy import local_energies
from runner.core.precond_types import force, from_dense
from runner.core.sr import _pcg, _ritz
from runner.core.stats import clip_outliers
from runner.core.vmc import energy_and_update
from runner.core.wavefunction import gradient_mode
from tests.helpers.exact import MODELS, exact_energy, exact_setup, exact_weighted, problem_of, wirtinger_reference
from tests.helpers.jacobians import random_jacobian


@pytest.mark.parametrize("model_name", sorted(MODELS))
@pytest.mark.slow
def test_gradient_matches_exact_derivative(model_name):
    lattice, ham, model, states, params, H = exact_setup(model_name)
    problem = problem_of(model, ham)
    mode = gradient_mode(params, model)
    assert mode == {"rbm_real": "real", "mlp_real": "real", "nonholomorphic": "split"}.get(model_name, "holomorphic")
    Obar, eps, E = exact_weighted(problem, params, states, mode)
    np.testing.assert_allclose(E, exact_energy(model, states, H)(params), rtol=1e-10)
    core_mode = "real" if mode == "split" else mode
    F = force(from_dense(Obar.T, core_mode), eps, core_mode)
    if mode == "split":
        n = F.shape[0] // 2
        F = F[:n] + 1j * F[n:]
    expected = wirtinger_reference(exact_energy(model, states, H), params)
    np.testing.assert_allclose(np.asarray(F), np.asarray(expected), rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("model_name", ["rbm_real", "rbm_complex", "nonholomorphic"])
@pytest.mark.parametrize("solver", ["cholesky", "eigh"])
@pytest.mark.slow
def test_sr_and_minsr_match_exact_solve(model_name, solver):
    lattice, ham, model, states, params, H = exact_setup(model_name, seed=1)
    problem = problem_of(model, ham)
    mode = gradient_mode(params, model)
    core_mode = "real" if mode == "split" else mode
    Obar, eps, _ = exact_weighted(problem, params, states, mode)
    shift = 0.05
    # Reference: S and F built explicitly from the definitions, solved densely in NumPy.
    Ob, ep = np.asarray(Obar), np.asarray(eps)
    if core_mode == "real":
        S, F = (Ob.conj().T @ Ob).real, 2 * (Ob.conj().T @ ep).real
    else:
        S, F = Ob.conj().T @ Ob, 2 * (Ob.conj().T @ ep)
    expected = np.linalg.solve(S + shift * np.eye(len(S)), F)
    jac = from_dense(Obar.T, core_mode)
    sr = precond.sr(diag_shift=shift, solver=solver)(jac, eps, core_mode)
    minsr = precond.minsr(diag_shift=shift, solver=solver)(jac, eps, core_mode)
    np.testing.assert_allclose(np.asarray(sr), expected, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(np.asarray(minsr), expected, rtol=1e-6, atol=1e-8)
    cg = precond.sr(diag_shift=shift, solver="cg", cg_tol=1e-12, cg_maxiter=2000)
    np.testing.assert_allclose(np.asarray(cg(jac, eps, core_mode)), expected, rtol=1e-6, atol=1e-8)
    # A warm start at the answer stays there.
    warm = cg.init(sr)._replace(x0=jnp.asarray(expected, sr.dtype))
    np.testing.assert_allclose(np.asarray(cg(jac, eps, core_mode, warm)), expected, rtol=1e-8, atol=1e-10)


def test_sr_holomorphic_equals_split_for_holomorphic_model():
    """The complex fast path and the general real-split path give the same update."""
    lattice, ham, model, states, params, H = exact_setup("rbm_complex", seed=2)
    problem = problem_of(model, ham)
    solve = precond.sr(diag_shift=0.02, solver="cholesky")
    Obar, eps, _ = exact_weighted(problem, params, states, "holomorphic")
    holo = solve(from_dense(Obar.T, "holomorphic"), eps, "holomorphic")
    Obar_s, eps_s, _ = exact_weighted(problem, params, states, "split")
    split = solve(from_dense(Obar_s.T, "real"), eps_s, "real")
    n = split.shape[0] // 2
    np.testing.assert_allclose(np.asarray(holo), np.asarray(split[:n] + 1j * split[n:]), rtol=1e-7, atol=1e-10)


def test_cholesky_falls_back_on_singular_metric():
    Obar = jnp.zeros((8, 3)).at[:, 0].set(jnp.linspace(-1, 1, 8))
    eps = jnp.linspace(0.5, -0.5, 8)
    x = precond.sr(diag_shift=0.0, solver="cholesky")(from_dense(Obar.T, "real"), eps, "real")
    assert np.all(np.isfinite(np.asarray(x)))
    np.testing.assert_allclose(np.asarray(x)[1:], 0.0)


@pytest.mark.parametrize("model_name", ["rbm_real", "mlp_real", "rbm_complex", "nonholomorphic"])
@pytest.mark.slow
def test_jacobian_products_equal_the_dense_matrix(model_name):
    """The products SR's conjugate gradients use (O never formed) equal those with dense O."""
    lattice, ham, model, states, params, H = exact_setup(model_name, seed=3)
    problem = problem_of(model, ham)
    mode = gradient_mode(params, model)
    core_mode = "real" if mode == "split" else mode
    sigma = jnp.asarray(states[:40]).reshape(4, 10, -1)
    lazy = jacobian(problem, params, sigma, mode)
    dense = from_dense(lazy.dense(), core_mode)
    P = lazy.dense().shape[0]
    key1, key2 = jax.random.split(jax.random.PRNGKey(0))
    v = jax.random.normal(key1, (P,))
    if core_mode == "holomorphic":
        v = v + 1j * jax.random.normal(key2, (P,))
    w = jax.random.normal(key2, dense.matvec(v).shape)
    eps = jnp.linspace(-1.0, 1.0, 40) * (1 + 0.5j)
    for a, b in [(lazy.matvec(v), dense.matvec(v)), (lazy.rmatvec(w), dense.rmatvec(w)),
                 (force(lazy, eps, core_mode), force(dense, eps, core_mode))]:
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)
    dense_sr = precond.sr(diag_shift=0.01, solver="cholesky")(lazy, eps, core_mode)
    cg_sr = precond.sr(diag_shift=0.01, solver="cg", cg_tol=1e-12)(lazy, eps, core_mode)
    np.testing.assert_allclose(np.asarray(cg_sr), np.asarray(dense_sr), rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("mode", ["real", "holomorphic"])
def test_ritz_basis_from_cg_finds_the_top_eigenpairs(mode):
    Obar, eps = random_jacobian(0, 60, 200, mode)
    jac = from_dense(Obar, mode)
    shift = 0.01
    A_dense = np.asarray(jnp.conj(Obar) @ Obar.T) + shift * np.eye(60)
    if mode == "real":
        A_dense = A_dense.real
    A = lambda x: jac.rmatvec(jac.matvec(x)) + shift * x  # noqa: E731
    F = force(jac, eps, mode)
    zeros = jnp.zeros((60, 0), F.dtype)
    _, record, _, _ = _pcg(A, F, jnp.zeros_like(F), zeros, jnp.zeros(0), tol=1e-12, maxiter=1000, n_record=24)
    basis, scale = _ritz(record, 6)
    w, V = np.linalg.eigh(A_dense)
    U = np.asarray(basis)
    np.testing.assert_allclose(U.conj().T @ U, np.eye(6), atol=1e-8)  # orthonormal
    # The top pairs are converged: Rayleigh quotients and overlaps with the exact eigenvectors.
    ritz = np.real(np.einsum("pi,pq,qi->i", U.conj(), A_dense, U))
    np.testing.assert_allclose(ritz[:3], w[::-1][:3], rtol=1e-8)
    np.testing.assert_allclose(np.abs(np.sum(U[:, :3].conj() * V[:, ::-1][:, :3], axis=0)), 1.0, atol=1e-6)
    # scale maps each Ritz value to the smallest of the six: 1 + scale = theta_6 / theta.
    np.testing.assert_allclose(np.asarray(1 + scale), ritz[-1] / ritz, rtol=1e-6)


@pytest.mark.parametrize("mode", ["real", "holomorphic"])
@pytest.mark.slow
def test_recycled_cg_matches_cholesky_over_drifting_steps(mode):
    """CG deflated with a basis from earlier (different) matrices still solves each step
    exactly: the preconditioner is positive definite whatever its basis."""
    cg = precond.sr(diag_shift=0.01, solver="cg", cg_tol=1e-12, cg_maxiter=2000, cg_recycle_rank=8,
                    cg_recycle_every=3)
    dense = precond.sr(diag_shift=0.01, solver="cholesky")
    Obar0, _ = random_jacobian(1, 80, 300, mode)
    update = jax.jit(lambda Obar, eps, state: cg.update(from_dense(Obar, mode), eps, mode, state))
    state = cg.init(jnp.zeros(80, Obar0.dtype))
    for step in range(7):
        drift, eps = random_jacobian(10 + step, 80, 300, mode)
        Obar = Obar0 + 0.2 * drift
        x, state, info = update(Obar, eps, state)
        expected = dense(from_dense(Obar, mode), eps, mode)
        np.testing.assert_allclose(np.asarray(x), np.asarray(expected), rtol=1e-8, atol=1e-10)
        assert 1 <= int(state.age) <= 3  # steps since the last refresh (every 3, or earlier)
        assert np.all(np.asarray(state.scale) <= 0) and np.any(np.asarray(state.scale) < 0)


def test_cg_with_an_arbitrary_basis_still_converges():
    Obar, eps = random_jacobian(2, 50, 120, "real")
    jac = from_dense(Obar, "real")
    cg = precond.sr(diag_shift=0.01, solver="cg", cg_tol=1e-12, cg_maxiter=2000, cg_recycle_rank=5,
                    cg_recycle_every=100)
    junk, _ = jnp.linalg.qr(jax.random.normal(jax.random.PRNGKey(5), (50, 5)))
    state = cg.init(eps[:50])._replace(basis=junk, scale=jnp.full(5, -0.999), age=jnp.ones((), jnp.int32))
    expected = precond.sr(diag_shift=0.01, solver="cholesky")(jac, eps, "real")
    np.testing.assert_allclose(np.asarray(cg(jac, eps, "real", state)), np.asarray(expected), rtol=1e-8, atol=1e-10)


@pytest.mark.slow
def test_clip_local_energy_changes_only_the_gradient_of_outlying_samples():
    """energy_and_update with clip_local_energy: the energy statistics are the raw ones; the
    update is the one from the clipped local energies (checked against the force computed
    from clipped values by hand); without outliers beyond the limit nothing changes."""

    lattice, ham, model, states, params, H = exact_setup("rbm_complex")
    plain = problem_of(model, ham)
    clipped = dataclasses.replace(plain, clip_local_energy=0.5)
    loose = dataclasses.replace(plain, clip_local_energy=1e6)
    sigma = jnp.asarray(states)[: 16 * (len(states) // 16)].reshape(16, -1, lattice.n_sites)
    stats_p, upd_p, _, _ = energy_and_update(plain, params, sigma, ())
    stats_c, upd_c, _, _ = energy_and_update(clipped, params, sigma, ())
    _, upd_l, _, _ = energy_and_update(loose, params, sigma, ())
    assert stats_c.mean == stats_p.mean and stats_c.variance == stats_p.variance
    flat = lambda t: np.concatenate([np.ravel(x) for x in jax.tree_util.tree_leaves(t)])  # noqa: E731
    np.testing.assert_allclose(flat(upd_l), flat(upd_p), rtol=1e-12)
    eloc = local_energies(plain, params, sigma)
    e = clip_outliers(eloc, 0.5)
    assert np.sum(np.asarray(e != eloc)) > 0  # the limit bites on this batch
    mode = gradient_mode(params, model)
    jac = jacobian(plain, params, sigma, mode)
    n = e.size
    eps = (e.reshape(-1) - jnp.mean(e)) / jnp.sqrt(n)
    expected = force(jac, eps, mode)
    np.testing.assert_allclose(flat(upd_c), np.asarray(expected), rtol=1e-10)
    assert not np.allclose(flat(upd_c), flat(upd_p), rtol=1e-3)
