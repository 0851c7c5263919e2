"""Preconditioners: layout-invariant dense SR, CG's dtype-aware tolerance and its reported work."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from runner import precond
from runner.stats import chain_sum, statistics


def _random_jacobian(seed, n_params, n_samples, mode, dtype=jnp.float64):
    """A dense Obar with a spread spectrum (a few large directions, like real log-derivatives)."""
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(seed), 3)
    weights = jnp.geomspace(3.0, 0.01, n_params)
    Obar = jax.random.normal(k1, (n_params, n_samples)) * weights[:, None]
    eps = jax.random.normal(k2, (n_samples,))
    if mode == "holomorphic":
        Obar = Obar + 1j * jax.random.normal(k3, (n_params, n_samples)) * weights[:, None]
        eps = eps * (1 + 0.3j)
        dtype = {jnp.float64: jnp.complex128, jnp.float32: jnp.complex64}[dtype]
    return (Obar / jnp.sqrt(n_samples)).astype(dtype), (eps / jnp.sqrt(n_samples)).astype(dtype)


def _on_devices(fn, n_devices, *args, mesh_in_context=False):
    """fn jitted with every argument's last axis (samples, chain-major) split over n devices,
    compiled under that mesh (`jax.set_mesh`) if asked."""
    mesh = Mesh(np.asarray(jax.devices()[:n_devices]), ("chains",))
    shardings = tuple(NamedSharding(mesh, PartitionSpec(*([None] * (a.ndim - 1)), "chains")) for a in args)
    if mesh_in_context:
        with jax.set_mesh(mesh):
            out = jax.jit(fn, in_shardings=shardings)(*args)
    else:
        out = jax.jit(fn, in_shardings=shardings)(*args)
    return jax.tree_util.tree_map(np.asarray, out)


def _halving_sum(rows):
    """Reference for chain_sum in plain Python floats: add the second half onto the first."""
    rows = [np.asarray(r, np.float64) for r in rows]
    while len(rows) > 1:
        if len(rows) % 2:
            rows.append(np.zeros_like(rows[0]))
        half = len(rows) // 2
        rows = [a + b for a, b in zip(rows[:half], rows[half:])]
    return rows[0]


@pytest.mark.parametrize("n_chains", [1, 5, 12, 16])
def test_chain_sum_adds_in_a_fixed_pairwise_order(n_chains):
    x = jax.random.normal(jax.random.PRNGKey(n_chains), (n_chains, 7)) * jnp.geomspace(1, 1e12, 7)
    np.testing.assert_array_equal(chain_sum(x), _halving_sum(list(np.asarray(x))))


@pytest.mark.parametrize("n_devices", [2, 4])
def test_statistics_are_bitwise_the_same_on_every_layout(n_devices):
    x_TxC = jax.random.normal(jax.random.PRNGKey(1), (64, 16)) * 3.0 + 40.0
    stats = lambda x: statistics(x.T)  # noqa: E731
    for a, b in zip(_on_devices(stats, n_devices, x_TxC), _on_devices(stats, 1, x_TxC)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("mesh_in_context", [False, True], ids=["chain_by_chain", "gathered"])
@pytest.mark.parametrize("mode", ["real", "holomorphic"])
def test_dense_sr_is_bitwise_the_same_on_every_layout(mode, mesh_in_context):
    """Without a mesh in context the Gram matrix and force are summed chain by chain; under
    one, Obar is gathered onto every device and multiplied there. Either way no sum over
    samples is split into per-device partials."""
    Obar, eps = _random_jacobian(0, 40, 16 * 24, mode)
    sr = precond.sr(diag_shift=0.01, solver="cholesky")
    solve = lambda O, e: sr.update(precond.from_dense(O, mode)._replace(n_chains=16), e, mode, ())[0]  # noqa: E731
    x1 = _on_devices(solve, 1, Obar, eps, mesh_in_context=mesh_in_context)
    for n in (2, 4):
        np.testing.assert_array_equal(_on_devices(solve, n, Obar, eps, mesh_in_context=mesh_in_context), x1)
    # The same solution as from one product over all samples.
    np.testing.assert_allclose(x1, np.asarray(sr(precond.from_dense(Obar, mode), eps, mode)), rtol=1e-10)


def test_cg_tolerance_follows_the_dtype(caplog):
    assert precond.cg_tolerance(None, jnp.float64) == 1e-5
    assert precond.cg_tolerance(None, jnp.complex128) == 1e-5
    assert precond.cg_tolerance(None, jnp.float32) == 1e-3
    assert precond.cg_tolerance(None, jnp.complex64) == 1e-3
    assert precond.cg_tolerance(1e-7, jnp.float64) == 1e-7  # the user's value wins
    assert precond.cg_tolerance(1e-7, jnp.float32) == precond.CG_TOL_FLOOR[4]  # but not below reach
    with caplog.at_level(logging.WARNING, logger="runner.precond"):
        precond.sr(solver="cg", cg_tol=1e-7).init(jnp.zeros(10, jnp.float64))
        assert not caplog.records
        precond.sr(solver="cg", cg_tol=1e-7).init(jnp.zeros(10, jnp.float32))
    assert "cg_tol" in caplog.text and "float32" in caplog.text


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
@pytest.mark.parametrize("mode", ["real", "holomorphic"])
def test_cg_reaches_its_default_tolerance_and_reports_its_work(mode, dtype):
    """With the dtype's default tolerance CG converges well before cg_maxiter, in 32 bits as in
    64, and says how many iterations it took and the residual it stopped at."""
    Obar, eps = _random_jacobian(3, 60, 256, mode, dtype)
    cg = precond.sr(diag_shift=0.01, solver="cg", cg_maxiter=500)
    state = cg.init(jnp.zeros(60, Obar.dtype))
    x, _, info = jax.jit(lambda O, e: cg.update(precond.from_dense(O, mode), e, mode, state))(Obar, eps)
    tol = precond.cg_tolerance(None, dtype)
    assert 0 < int(info["cg_iters"]) < 500
    assert float(info["cg_residual"]) <= tol
    # The reported residual is the solve's: the true one agrees within rounding of the products.
    dense = precond.sr(diag_shift=0.01, solver="cholesky")
    expected = np.asarray(dense(precond.from_dense(Obar.astype(jnp.complex128 if mode != "real" else jnp.float64),
                                                   mode), eps.astype(jnp.complex128), mode))
    np.testing.assert_allclose(np.asarray(x), expected, rtol=0, atol=100 * tol * np.abs(expected).max())


def test_cg_stopped_by_maxiter_shows_it():
    Obar, eps = _random_jacobian(4, 60, 256, "real")
    cg = precond.sr(diag_shift=0.01, solver="cg", cg_maxiter=3, cg_recycle_rank=0)
    _, _, info = cg.update(precond.from_dense(Obar, "real"), eps, "real", cg.init(jnp.zeros(60)))
    assert int(info["cg_iters"]) == 3 and float(info["cg_residual"]) > 1e-5
    _, _, dense_info = precond.sr(solver="cholesky").update(precond.from_dense(Obar, "real"), eps, "real", ())
    assert dense_info == {}


@pytest.mark.parametrize("last_iters,refreshed", [(100, True), (5, False)])
def test_cg_refreshes_its_basis_when_deflation_stops_paying(last_iters, refreshed):
    """Between scheduled refreshes, a step whose predecessor needed more iterations than the
    last plain solve refreshes the deflation basis (a plain solve, recorded); otherwise not."""
    Obar, eps = _random_jacobian(5, 60, 256, "real")
    cg = precond.sr(diag_shift=0.01, solver="cg", cg_recycle_rank=8, cg_recycle_every=20)
    state = cg.init(jnp.zeros(60))._replace(age=jnp.int32(5), plain_iters=jnp.int32(10),
                                            last_iters=jnp.int32(last_iters))
    _, new, info = cg.update(precond.from_dense(Obar, "real"), eps, "real", state)
    assert int(new.last_iters) == int(info["cg_iters"])
    if refreshed:
        assert int(new.age) == 1 and int(new.plain_iters) == int(info["cg_iters"])
        assert float(jnp.abs(new.basis).sum()) > 0  # Ritz vectors recorded
    else:
        assert int(new.age) == 6 and int(new.plain_iters) == 10
        assert float(jnp.abs(new.basis).sum()) == 0  # the (empty) basis kept
