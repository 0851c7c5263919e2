"""Preconditioners: layout-invariant dense SR, CG's dtype-aware tolerance and its reported work."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from runner.core import precond
from runner.core.jacobian import jacobian, parameter_blocks
from runner.core.minsr import _after
from runner.core.precond_types import from_dense
from runner.core.sr import CG_TOL_FLOOR, cg_tolerance
from runner.core.stats import chain_sum, statistics
from runner.core.vmc import init_state
from runner.core.wavefunction import gradient_mode
from tests.helpers.jacobians import MINSR_MODES, assert_close, centred_jacobian, chunked, random_jacobian
from tests.helpers.parallel import on_devices


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
    for a, b in zip(on_devices(stats, n_devices, x_TxC), on_devices(stats, 1, x_TxC)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("mesh_in_context", [False, True], ids=["chain_by_chain", "gathered"])
@pytest.mark.parametrize("mode", ["real", "holomorphic"])
@pytest.mark.slow
def test_dense_sr_is_bitwise_the_same_on_every_layout(mode, mesh_in_context):
    """Without a mesh in context the Gram matrix and force are summed chain by chain; under
    one, Obar is gathered onto every device and multiplied there. Either way no sum over
    samples is split into per-device partials."""
    Obar, eps = random_jacobian(0, 40, 16 * 24, mode)
    sr = precond.sr(diag_shift=0.01, solver="cholesky")
    solve = lambda O, e: sr.update(from_dense(O, mode)._replace(n_chains=16), e, mode, ())[0]  # noqa: E731
    x1 = on_devices(solve, 1, Obar, eps, mesh_in_context=mesh_in_context)
    for n in (2, 4):
        np.testing.assert_array_equal(on_devices(solve, n, Obar, eps, mesh_in_context=mesh_in_context), x1)
    # The same solution as from one product over all samples.
    np.testing.assert_allclose(x1, np.asarray(sr(from_dense(Obar, mode), eps, mode)), rtol=1e-10)


def test_cg_tolerance_follows_the_dtype(caplog):
    assert cg_tolerance(None, jnp.float64) == 1e-5
    assert cg_tolerance(None, jnp.complex128) == 1e-5
    assert cg_tolerance(None, jnp.float32) == 1e-3
    assert cg_tolerance(None, jnp.complex64) == 1e-3
    assert cg_tolerance(1e-7, jnp.float64) == 1e-7  # the user's value wins
    assert cg_tolerance(1e-7, jnp.float32) == CG_TOL_FLOOR[4]  # but not below reach
    with caplog.at_level(logging.WARNING, logger="runner.core.precond"):
        precond.sr(solver="cg", cg_tol=1e-7).init(jnp.zeros(10, jnp.float64))
        assert not caplog.records
        precond.sr(solver="cg", cg_tol=1e-7).init(jnp.zeros(10, jnp.float32))
    assert "cg_tol" in caplog.text and "float32" in caplog.text


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
@pytest.mark.parametrize("mode", ["real", "holomorphic"])
@pytest.mark.slow
def test_cg_reaches_its_default_tolerance_and_reports_its_work(mode, dtype):
    """With the dtype's default tolerance CG converges well before cg_maxiter, in 32 bits as in
    64, and says how many iterations it took and the residual it stopped at."""
    Obar, eps = random_jacobian(3, 60, 256, mode, dtype)
    cg = precond.sr(diag_shift=0.01, solver="cg", cg_maxiter=500)
    state = cg.init(jnp.zeros(60, Obar.dtype))
    x, _, info = jax.jit(lambda O, e: cg.update(from_dense(O, mode), e, mode, state))(Obar, eps)
    tol = cg_tolerance(None, dtype)
    assert 0 < int(info["cg_iters"]) < 500
    assert float(info["cg_residual"]) <= tol
    # The reported residual is the solve's: the true one agrees within rounding of the products.
    dense = precond.sr(diag_shift=0.01, solver="cholesky")
    expected = np.asarray(dense(from_dense(Obar.astype(jnp.complex128 if mode != "real" else jnp.float64),
                                                   mode), eps.astype(jnp.complex128), mode))
    np.testing.assert_allclose(np.asarray(x), expected, rtol=0, atol=100 * tol * np.abs(expected).max())


def test_cg_stopped_by_maxiter_shows_it():
    Obar, eps = random_jacobian(4, 60, 256, "real")
    cg = precond.sr(diag_shift=0.01, solver="cg", cg_maxiter=3, cg_recycle_rank=0)
    _, _, info = cg.update(from_dense(Obar, "real"), eps, "real", cg.init(jnp.zeros(60)))
    assert int(info["cg_iters"]) == 3 and float(info["cg_residual"]) > 1e-5
    _, _, dense_info = precond.sr(solver="cholesky").update(from_dense(Obar, "real"), eps, "real", ())
    assert dense_info == {}


@pytest.mark.parametrize("last_iters,refreshed", [(100, True), (5, False)])
def test_cg_refreshes_its_basis_when_deflation_stops_paying(last_iters, refreshed):
    """Between scheduled refreshes, a step whose predecessor needed more iterations than the
    last plain solve refreshes the deflation basis (a plain solve, recorded); otherwise not."""
    Obar, eps = random_jacobian(5, 60, 256, "real")
    cg = precond.sr(diag_shift=0.01, solver="cg", cg_recycle_rank=8, cg_recycle_every=20)
    state = cg.init(jnp.zeros(60))._replace(age=jnp.int32(5), plain_iters=jnp.int32(10),
                                            last_iters=jnp.int32(last_iters))
    _, new, info = cg.update(from_dense(Obar, "real"), eps, "real", state)
    assert int(new.last_iters) == int(info["cg_iters"])
    if refreshed:
        assert int(new.age) == 1 and int(new.plain_iters) == int(info["cg_iters"])
        assert float(jnp.abs(new.basis).sum()) > 0  # Ritz vectors recorded
    else:
        assert int(new.age) == 6 and int(new.plain_iters) == 10
        assert float(jnp.abs(new.basis).sum()) == 0  # the (empty) basis kept


# --- minSR: the sample-space kernel built in chunks, and SPRING's momentum ------------------
# MINSR_MODES and the random Jacobians, centred and in chunks: tests/helpers/jacobians.py.


def _minsr_reference(Obar_PxS, eps_S, mode, diag_shift, momentum=0.0, previous=None):
    """x = A^+ (2 b - mu A x_prev) + mu x_prev in NumPy, with A the sample-space matrix of
    `mode` (rows: samples; real and imaginary parts stacked for real parameters and complex
    Obar), b the matching eps and A^+ = A^H (A A^H + diag_shift + [mu > 0] 1 1^T / N_s)^-1,
    one 1 1^T block per group of real samples (SPRING's regularisation)."""
    O_SxP, e_S = np.asarray(Obar_PxS).T, np.asarray(eps_S)
    n_samples = O_SxP.shape[0]
    if mode == "real" and np.iscomplexobj(O_SxP):
        A, b = np.concatenate([O_SxP.real, O_SxP.imag]), np.concatenate([e_S.real, e_S.imag])
    elif mode == "real":
        A, b = O_SxP, e_S.real
    else:
        A, b = O_SxP, e_S
    K = A @ A.conj().T + diag_shift * np.eye(A.shape[0])
    if momentum:
        for g in range(A.shape[0] // n_samples):
            K[g * n_samples:(g + 1) * n_samples, g * n_samples:(g + 1) * n_samples] += 1.0 / n_samples
    previous = np.zeros(A.shape[1], A.dtype) if previous is None else np.asarray(previous)
    return A.conj().T @ np.linalg.solve(K, 2.0 * b - momentum * (A @ previous)) + momentum * previous


@pytest.mark.parametrize("kind", sorted(MINSR_MODES))
@pytest.mark.slow
def test_chunked_minsr_equals_one_chunk_dense_minsr_and_sr(kind):
    """The kernel from 2 or 4 chunks (of 8 chains) gives the one-chunk solution to 1e-12, both
    equal the dense formula, and with fewer parameters than samples parameter-space SR at the
    same diag_shift: (A^H A + l)^-1 A^H = A^H (A A^H + l)^-1."""
    mode = MINSR_MODES[kind][1]
    minsr = precond.minsr(diag_shift=0.01)
    for n_params, n_samples in ((40, 96), (300, 48)):
        Obar, eps = centred_jacobian(7, n_params, n_samples, kind)
        one = jax.jit(lambda O, e: minsr(chunked(O, mode, 8, 1), e, mode))(Obar, eps)
        for n_chunks in (2, 4) if n_samples % 32 == 0 else (2, 3):
            assert_close(jax.jit(lambda O, e: minsr(chunked(O, mode, 8, n_chunks), e, mode))(Obar, eps), one, 1e-12)
        assert_close(one, _minsr_reference(Obar, eps, mode, 0.01), 1e-10)
        # A Jacobian without chunks: its dense matrix as one chunk.
        assert_close(minsr(from_dense(Obar, mode), eps, mode), one, 1e-12)
        if n_params < n_samples:
            sr = precond.sr(diag_shift=0.01, solver="cholesky")
            assert_close(sr(from_dense(Obar, mode), eps, mode), one, 1e-10)


# One case per mode: real parameters and log psi; complex holomorphic; real parameters with a
# complex log psi (the ViT).
MODEL_CASES = {
    "rbm_real": ["hilbert.L=8", "model=rbm"],
    "rbm_holomorphic": ["hilbert.L=8", "model=rbm", "dtype=complex128", "hamiltonian=heisenberg",
                        "hilbert.total_sz=0", "sampler=metropolis_exchange"],
    "vit_real_params_complex_logpsi": ["hilbert.L=6", "model=vit"],
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(MODEL_CASES))
def test_minsr_from_the_model_in_chunks_matches_its_dense_jacobian(case):
    """`jacobian`'s chunks (O made again per chunk, centred with the mean of a first pass)
    give the solution of the dense Jacobian's formula, with and without chunk_size, and with
    the kernel summed over blocks of parameter leaves (param_chunk_size: blocks of about a third
    of the parameters, and, for the RBMs' three leaves, one leaf per block; the ViT's 19 leaves
    one by one would compile 19 kernels for each solve)."""
    import dataclasses

    from runner.config.build import build
    from runner.core.sampler import sample
    from tests.helpers.config import compose_config

    experiment = build(compose_config([*MODEL_CASES[case], "preconditioner=minsr", "sampler.n_samples=64",
                                       "sampler.n_chains=8", "exact=false"]))
    problem = experiment.problem
    state = init_state(problem, 0, jnp.ones((experiment.hilbert.n_sites,), jnp.int8))
    _, sigma, _ = jax.jit(lambda s: sample(problem.sampler, problem.amplitude, s.params, s.chains))(state)
    mode = gradient_mode(state.params, problem.model)
    solve_mode = "real" if mode == "split" else mode
    Obar = jax.jit(lambda params, s: jacobian(problem, params, s, mode).dense())(state.params, sigma)
    assert Obar.shape[0] > 64  # more parameters than samples
    e = jax.random.normal(jax.random.PRNGKey(2), (64,)) / 8
    e = e * (1 + 0.5j) if jnp.iscomplexobj(Obar) else e
    solutions = {}
    leaves = [x.size for x in jax.tree_util.tree_leaves(state.params)]
    # Blocks of about a third of the parameters, and blocks of one leaf each (a few leaves only).
    for param_chunk_size in (None, sum(leaves) // 3, *((1,) if len(leaves) <= 4 else ())):
        for chunk in (None, 16):
            p = dataclasses.replace(problem, chunk_size=chunk,
                                    precondition=precond.minsr(0.01, param_chunk_size=param_chunk_size))
            solutions[chunk, param_chunk_size] = jax.jit(
                lambda params, s, e: p.precondition(jacobian(p, params, s, mode), e, solve_mode))(state.params, sigma, e)
    reference = np.asarray(solutions[None, None])
    for key, solution in solutions.items():
        assert_close(solution, reference, 1e-12)
    assert_close(reference, _minsr_reference(Obar, e, solve_mode, 0.01), 1e-9)
    assert (None, 1) in solutions or case.startswith("vit")
    assert parameter_blocks(state.params, 1) == [(k, k + 1) for k in range(len(leaves))]
    assert len(parameter_blocks(state.params, sum(leaves) // 3)) >= 3


def test_chunked_minsr_memory_is_bounded_by_the_chunk():
    """Compiled temporary memory of one minSR solve for an RBM with P = 21,348 parameters and
    S = 2,048 samples (nothing runs): with chunk_size = 256 it stays within 4 x chunk_size x P
    numbers plus 4 kernels (S x S), below a third of the unchunked solve, which holds O."""
    import dataclasses

    from runner.config.build import build
    from tests.helpers.config import compose_config

    experiment = build(compose_config(["hilbert.L=36", "model.alpha=16", "preconditioner=minsr",
                                       "sampler.n_samples=2048", "sampler.n_chains=16", "exact=false"]))
    problem = experiment.problem
    state = jax.eval_shape(lambda: init_state(problem, 0, jnp.ones((36,), jnp.int8)))
    n_params = sum(x.size for x in jax.tree_util.tree_leaves(state.params))
    sigma = jax.ShapeDtypeStruct((16, 128, 36), jnp.int8)
    eps = jax.ShapeDtypeStruct((2048,), jnp.float64)
    temp = {}
    for chunk in (None, 256):
        p = dataclasses.replace(problem, chunk_size=chunk)
        solve = jax.jit(lambda params, s, e: p.precondition(jacobian(p, params, s, "real"), e, "real"))
        temp[chunk] = solve.lower(state.params, sigma, eps).compile().memory_analysis().temp_size_in_bytes
    assert n_params == 21348
    assert temp[None] > 2048 * n_params * 8  # O itself
    assert temp[256] <= 4 * 256 * n_params * 8 + 4 * 2048**2 * 8
    assert temp[256] < temp[None] / 3


@pytest.mark.parametrize("kind", sorted(MINSR_MODES))
@pytest.mark.slow
def test_spring_two_steps_match_the_formula(kind):
    """SPRING with mu = 0.8: two consecutive steps (the second from the first's state, its
    kernel in 2 chunks) equal x_k = A^+ (2 eps - mu A x_{k-1}) + mu x_{k-1} from NumPy."""
    mode = MINSR_MODES[kind][1]
    spring = precond.minsr(diag_shift=0.01, momentum=0.8)
    (O1, e1), (O2, e2) = centred_jacobian(11, 120, 48, kind), centred_jacobian(12, 120, 48, kind)
    x_dtype = O1.dtype if mode == "holomorphic" else O1.real.dtype
    state = spring.init(jnp.zeros(120, x_dtype))
    x1, state, _ = jax.jit(lambda O, e, s: spring.update(chunked(O, mode, 8, 1), e, mode, s))(O1, e1, state)
    np.testing.assert_array_equal(state, x1)  # the state is the update
    x2, state, _ = jax.jit(lambda O, e, s: spring.update(chunked(O, mode, 8, 2), e, mode, s))(O2, e2, state)
    ref1 = _minsr_reference(O1, e1, mode, 0.01, momentum=0.8)
    ref2 = _minsr_reference(O2, e2, mode, 0.01, momentum=0.8, previous=ref1)
    assert_close(x1, ref1, 1e-10)
    assert_close(x2, ref2, 1e-10)
    # The momentum matters, and without it minSR carries no state.
    plain = precond.minsr(diag_shift=0.01, momentum=0.0)
    assert plain.init(jnp.zeros(120, x_dtype)) == ()
    assert np.abs(np.asarray(plain(chunked(O2, mode, 8, 2), e2, mode)) - ref2).max() > 1e-3 * np.abs(ref2).max()


def _metric_norm(x, Obar_PxS, mode):
    """sqrt(x^H S x) in NumPy, S = A^H A with A the sample-space matrix of `mode` (as in
    `_minsr_reference`)."""
    O_SxP = np.asarray(Obar_PxS).T
    A = np.concatenate([O_SxP.real, O_SxP.imag]) if mode == "real" else O_SxP
    return float(np.linalg.norm(A @ np.asarray(x)))


@pytest.mark.parametrize("kind", sorted(MINSR_MODES))
@pytest.mark.parametrize("solver", ["cholesky", "cg", "minsr"])
@pytest.mark.slow
def test_max_norm_caps_the_step_length_in_the_metric(kind, solver):
    """With max_norm the direction is the uncapped one scaled to sqrt(x^H S x) = max_norm when
    it was longer (the reported step_norm is its length before, from NumPy's S), and the very
    same bits when it was shorter; no step_norm without a cap."""
    mode = MINSR_MODES[kind][1]
    Obar, eps = centred_jacobian(5, 40, 96, kind)
    if solver == "minsr":
        make = lambda **kw: precond.minsr(diag_shift=0.01, **kw)  # noqa: E731
        jac = chunked(Obar, mode, 8, 2)
    else:
        make = lambda **kw: precond.sr(diag_shift=0.01, solver=solver, cg_tol=1e-10, **kw)  # noqa: E731
        jac = from_dense(Obar, mode)._replace(n_chains=8)
    x_dtype = Obar.dtype if mode == "holomorphic" else Obar.real.dtype

    def solve(max_norm):
        p = make(max_norm=max_norm)
        return jax.jit(lambda O, e: p.update(jac, e, mode, p.init(jnp.zeros(40, x_dtype))))(Obar, eps)

    x, _, info = solve(None)
    assert "step_norm" not in info
    norm = _metric_norm(x, Obar, mode)
    capped, _, info = solve(norm / 2)
    np.testing.assert_allclose(float(info["step_norm"]), norm, rtol=1e-8)
    assert_close(capped, np.asarray(x) / 2, 1e-10)
    np.testing.assert_allclose(_metric_norm(capped, Obar, mode), norm / 2, rtol=1e-8)
    same, _, _ = solve(norm * 2)
    np.testing.assert_array_equal(same, x)


@pytest.mark.parametrize("shifts", [{"diag_shift": 0.01}, {"diag_shift": 1e-3, "diag_scale": 0.5}],
                         ids=["absolute", "relative"])
def test_a_capped_sr_step_is_bitwise_the_same_on_every_layout(shifts):
    """SR's capped direction and its length (a dot product over parameters) are the same bits
    on 1, 2 and 4 devices under a mesh, with an absolute shift and with one relative to diag(S)
    (cg's, minSR's: tests/integration/test_parallel.py and tests/core/test_diag_scale.py, in whole runs)."""
    mode = "holomorphic"
    Obar, eps = centred_jacobian(3, 40, 16 * 24, "holomorphic")
    p = precond.sr(**shifts, solver="cholesky", max_norm=0.1)
    solve = lambda O, e: p.update(from_dense(O, mode)._replace(n_chains=16), e, mode, ())  # noqa: E731
    x1, _, info1 = on_devices(solve, 1, Obar, eps, mesh_in_context=True)
    assert float(info1["step_norm"]) > 0.1  # the cap binds
    for n in (2, 4):
        x, _, info = on_devices(solve, n, Obar, eps, mesh_in_context=True)
        np.testing.assert_array_equal(info["step_norm"], info1["step_norm"])
        np.testing.assert_array_equal(x, x1)


def test_max_norm_is_checked():
    from runner.errors import ConfigError

    for bad in (0, -1.0, "big"):
        with pytest.raises(ConfigError) as info:
            precond.sr(max_norm=bad)
        assert info.value.key == "max_norm"
    with pytest.raises(ConfigError) as info:
        precond.minsr(momentum=0.5, max_norm=1.0)
    assert info.value.key == "max_norm"


@pytest.mark.parametrize("momentum", [1.0, -0.1, "high"])
def test_minsr_momentum_is_checked(momentum):
    from runner.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        precond.minsr(momentum=momentum)
    assert info.value.key == "momentum"


@pytest.mark.slow
def test_spring_state_survives_checkpoint_and_resume(tmp_path):
    """A SPRING run stopped after 3 steps and resumed from its checkpoint gives bitwise the
    same energies and final checkpoint (parameters, chains, the previous update) as a run of 6
    steps straight through."""
    import dataclasses

    from runner import app
    from runner.config.build import build
    from runner.parallel import mesh
    from tests.helpers.config import compose_config
    from tests.helpers.runs import assert_identical_runs, checkpoint_leaves

    experiment = build(compose_config([*MODEL_CASES["rbm_holomorphic"], "preconditioner=minsr",
                                       "preconditioner.momentum=0.9", "chunk_size=32", "sampler.n_samples=128",
                                       "sampler.n_chains=8", "n_iter=6", "final_rounds=1", "exact=false",
                                       "checkpoint_every=100"]))
    short = dataclasses.replace(experiment, settings=dataclasses.replace(experiment.settings, n_iter=3))
    layout = mesh.make_mesh("single")
    app.execute(short, layout, tmp_path / "resumed")
    # The previous update is the checkpoint's last array (the VMC state's last field).
    assert list(checkpoint_leaves(tmp_path / "resumed").values())[-1].shape == (
        sum(x.size for x in jax.tree_util.tree_leaves(short.problem.model.init(
            jax.random.PRNGKey(0), jnp.ones((8,), jnp.int8))["params"])),)
    app.execute(experiment, layout, tmp_path / "resumed")
    app.execute(experiment, layout, tmp_path / "straight")
    assert_identical_runs(tmp_path / "resumed", tmp_path / "straight")


def test_the_kernel_loops_start_after_the_right_hand_side():
    """`minsr._after` ties x to y through a value XLA cannot fold away (a NaN in y reaches x):
    minSR starts its kernel's loops from it, so the gather of the right-hand side runs first on
    every device (two devices once waited on each other's collectives forever without it)."""
    tied = jax.jit(_after)(jnp.zeros(3), jnp.asarray([np.nan, 1.0]))
    assert np.all(np.isnan(np.asarray(tied)))
    np.testing.assert_array_equal(jax.jit(_after)(jnp.arange(3.0), jnp.ones(2) + 1j), np.arange(3.0))
