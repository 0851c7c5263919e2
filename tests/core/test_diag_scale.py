"""SR and minSR with a shift relative to diag(S): (S + diag_shift + diag_scale diag(S)) x = F."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from runner.core import precond
from runner.core.diag_scale import metric_diagonal
from runner.core.precond_types import SampleChunks, from_dense
from runner.errors import ConfigError
from tests.helpers.jacobians import MINSR_MODES, assert_close, centred_jacobian, chunked
from tests.helpers.parallel import on_devices

SOLVERS = ("cholesky", "eigh", "cg", "minsr", "minsr_blocks")


def _reference(Obar_PxS, eps_S, mode, diag_shift, diag_scale, momentum=0.0, previous=None):
    """x = (S + Lambda)^-1 (F - mu S x_prev) + mu x_prev in NumPy, Lambda = diag_shift +
    diag_scale diag(S), with S = A^H A and F = 2 A^H b (A, b: the sample-space matrix and
    residuals of `mode`, real and imaginary parts stacked for real parameters and complex Obar)."""
    O_SxP, e_S = np.asarray(Obar_PxS).T, np.asarray(eps_S)
    if mode == "real":
        A = np.concatenate([O_SxP.real, O_SxP.imag]) if np.iscomplexobj(O_SxP) else O_SxP
        b = np.concatenate([e_S.real, e_S.imag]) if np.iscomplexobj(O_SxP) else e_S.real
    else:
        A, b = O_SxP, e_S
    S = A.conj().T @ A
    F = 2.0 * A.conj().T @ b
    Lambda = diag_shift + diag_scale * np.real(np.diag(S))
    previous = np.zeros(A.shape[1], A.dtype) if previous is None else np.asarray(previous)
    return np.linalg.solve(S + np.diag(Lambda), F - momentum * S @ previous) + momentum * previous


def _in_blocks(jac, widths):
    """The Jacobian's chunks with parameter blocks of the given column widths (`by_parameters`)."""
    chunks, edges = jac.chunks, np.cumsum([0, *widths])

    def block(lo, hi):
        return SampleChunks(chunks.n, lambda: (lambda rows: lambda k: rows(k)[..., lo:hi])(chunks.start()))

    return jac._replace(chunks=chunks._replace(
        by_parameters=lambda size: [block(lo, hi) for lo, hi in zip(edges[:-1], edges[1:])]))


def _solve(solver, Obar, eps, mode, n_params, **kw):
    """One direction of the named solver (minSR's kernel from 2 chunks of 8 chains; with blocks
    also from 3 parameter blocks)."""
    if solver.startswith("minsr"):
        p = precond.minsr(param_chunk_size=10 if solver == "minsr_blocks" else None, **kw)
        jac = chunked(Obar, mode, 8, 2)
        if solver == "minsr_blocks":
            jac = _in_blocks(jac, (n_params // 3, n_params // 3, n_params - 2 * (n_params // 3)))
    else:
        p = precond.sr(solver=solver, cg_tol=1e-12, cg_maxiter=5000, **kw)
        jac = from_dense(Obar, mode)._replace(n_chains=8)
    x_dtype = Obar.dtype if mode == "holomorphic" else Obar.real.dtype
    return jax.jit(lambda O, e: p.update(jac, e, mode, p.init(jnp.zeros(n_params, x_dtype))))(Obar, eps)


@pytest.mark.parametrize("kind", sorted(MINSR_MODES))
@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.slow
def test_every_solver_solves_the_relatively_shifted_system(kind, solver):
    """Each solver's direction is NumPy's dense solve of (S + diag_shift + diag_scale diag(S)) x = F,
    with fewer and with more parameters than samples (real parameters with a real and a complex
    log psi, complex holomorphic); a diag_shift schedule is read at the step; diag_scale = 0 is
    the plain diag_shift to rounding; diag_scale = 1 is another direction than without."""
    mode = MINSR_MODES[kind][1]
    for n_params, n_samples in ((40, 96), (120, 48)):
        Obar, eps = centred_jacobian(9, n_params, n_samples, kind)
        x, _, _ = _solve(solver, Obar, eps, mode, n_params, diag_shift=1e-3, diag_scale=0.5)
        expected = _reference(Obar, eps, mode, 1e-3, 0.5)
        assert_close(x, expected, 1e-8)
        plain, _, _ = _solve(solver, Obar, eps, mode, n_params, diag_shift=1e-3)
        zero, _, _ = _solve(solver, Obar, eps, mode, n_params, diag_shift=1e-3, diag_scale=0.0)
        assert_close(zero, np.asarray(plain), 1e-8)
        assert np.abs(np.asarray(plain) - expected).max() > 1e-2 * np.abs(expected).max()
    scheduled, _, info = _solve(solver, Obar, eps, mode, n_params, diag_shift=lambda step: 1e-3 + 0 * step,
                                diag_scale=0.5)
    assert_close(scheduled, expected, 1e-8)
    assert float(info["diag_shift"]) == pytest.approx(1e-3)


@pytest.mark.parametrize("kind", sorted(MINSR_MODES))
def test_spring_with_a_relative_shift_matches_the_formula(kind):
    """SPRING with diag_scale: x_k = (S + Lambda)^-1 (F - mu S x_{k-1}) + mu x_{k-1}, two steps."""
    mode = MINSR_MODES[kind][1]
    spring = precond.minsr(diag_shift=1e-3, momentum=0.8, diag_scale=0.5)
    (O1, e1), (O2, e2) = centred_jacobian(11, 120, 48, kind), centred_jacobian(12, 120, 48, kind)
    x_dtype = O1.dtype if mode == "holomorphic" else O1.real.dtype
    state = spring.init(jnp.zeros(120, x_dtype))
    x1, state, _ = jax.jit(lambda O, e, s: spring.update(chunked(O, mode, 8, 1), e, mode, s))(O1, e1, state)
    x2, _, _ = jax.jit(lambda O, e, s: spring.update(chunked(O, mode, 8, 2), e, mode, s))(O2, e2, state)
    ref1 = _reference(O1, e1, mode, 1e-3, 0.5, momentum=0.8)
    assert_close(x1, ref1, 1e-8)
    assert_close(x2, _reference(O2, e2, mode, 1e-3, 0.5, momentum=0.8, previous=ref1), 1e-8)


@pytest.mark.parametrize("solver", ["cholesky", "minsr"])
def test_max_norm_measures_the_step_in_s_with_a_relative_shift(solver):
    """With diag_scale, the trust region still measures sqrt(x^H S x) (S itself, not S + Lambda)."""
    mode = "holomorphic"
    Obar, eps = centred_jacobian(5, 40, 96, "holomorphic")
    x, _, _ = _solve(solver, Obar, eps, mode, 40, diag_shift=1e-3, diag_scale=0.5)
    norm = float(np.linalg.norm(np.asarray(Obar).T @ np.asarray(x)))
    capped, _, info = _solve(solver, Obar, eps, mode, 40, diag_shift=1e-3, diag_scale=0.5, max_norm=norm / 2)
    np.testing.assert_allclose(float(info["step_norm"]), norm, rtol=1e-8)
    assert_close(capped, np.asarray(x) / 2, 1e-10)


@pytest.mark.parametrize("kind", sorted(MINSR_MODES))
def test_the_metric_diagonal_is_bitwise_the_same_on_every_layout(kind):
    """diag(S) from 3 chunks of 16 chains: NumPy's diag(A^H A), and the same bits on 1, 2 and 4
    devices (chain sums added in a fixed order)."""
    mode = MINSR_MODES[kind][1]
    Obar, eps = centred_jacobian(6, 40, 16 * 24, kind)
    diagonal = lambda O: metric_diagonal(chunked(O, mode, 16, 3).chunks)  # noqa: E731
    d1 = on_devices(diagonal, 1, Obar, mesh_in_context=True)
    np.testing.assert_allclose(d1, (np.abs(np.asarray(Obar)) ** 2).sum(axis=1), rtol=1e-12)
    for n in (2, 4):
        np.testing.assert_array_equal(on_devices(diagonal, n, Obar, mesh_in_context=True), d1)


def test_a_parameter_without_derivative_gets_no_step():
    """A column of Obar that is zero (a derivative constant over the samples) with diag_shift 0:
    its component of the direction is 0, the others solve the system without it."""
    Obar, eps = centred_jacobian(4, 40, 96, "real")
    Obar = Obar.at[7].set(0.0)
    for solver in ("cholesky", "minsr"):
        x, _, _ = _solve(solver, Obar, eps, "real", 40, diag_shift=0.0, diag_scale=0.5)
        assert np.all(np.isfinite(np.asarray(x))) and float(x[7]) == 0.0
        keep = np.arange(40) != 7
        assert_close(np.asarray(x)[keep], _reference(Obar[keep], eps, "real", 0.0, 0.5), 1e-8)


@pytest.mark.parametrize("bad", [-0.1, "big", float("nan"), True])
def test_diag_scale_is_checked(bad):
    for make in (precond.sr, precond.minsr):
        with pytest.raises(ConfigError) as info:
            make(diag_scale=bad)
        assert info.value.key == "diag_scale"


def test_a_config_with_diag_scale_builds_and_a_bad_one_is_refused_before_compiling():
    from runner.config.build import build
    from tests.helpers.config import compose_config

    for group in ("sr", "minsr"):
        experiment = build(compose_config([f"preconditioner={group}", "preconditioner.diag_scale=0.1",
                                           "hilbert.L=6", "exact=false"]))
        assert experiment.problem.precondition is not None
        with pytest.raises(ConfigError) as info:
            build(compose_config([f"preconditioner={group}", "preconditioner.diag_scale=-1", "hilbert.L=6"]))
        assert info.value.key == "preconditioner.diag_scale"


# Whole runs with diag_scale on 1 and 4 devices: dense SR, cg (diag(S) from the Jacobian's chunks)
# and minSR (kernel from chunks, over parameter blocks).
LAYOUT_CASES = {
    "sr_dense": ["hilbert.L=8", "model=rbm", "preconditioner.solver=cholesky"],
    "sr_cg": ["hilbert.L=8", "model=rbm", "preconditioner.solver=cg"],
    "minsr_chunks_blocks": ["hilbert.L=8", "hilbert.total_sz=0", "hamiltonian=heisenberg",
                            "sampler=metropolis_exchange", "dtype=complex128", "model.alpha=4", "preconditioner=minsr",
                            "chunk_size=32", "preconditioner.param_chunk_size=64"],
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(LAYOUT_CASES))
def test_runs_with_diag_scale_are_the_same_on_every_layout(case, tmp_path):
    """Energies of 8 steps and the final estimate on 1 and 4 devices: the same bits with dense
    SR and cg; with minSR to a relative 1e-10 (its kernel differs in the last bit on some CPUs without
    diag_scale too, tests/integration/test_parallel.py)."""
    import json

    from runner import app
    from runner.config.build import build
    from runner.parallel import mesh
    from tests.helpers.config import compose_config

    experiment = build(compose_config([*LAYOUT_CASES[case], "preconditioner.diag_scale=0.1",
                                       "sampler.n_samples=256", "sampler.n_chains=8",
                                       "n_iter=8", "final_rounds=1", "exact=false", "peak_search=0"]))
    one = app.execute(experiment, mesh.make_mesh("single"), tmp_path / "single")
    four = app.execute(experiment, mesh.make_mesh("sharded"), tmp_path / "sharded")
    assert four["devices"] == 4 and one["devices"] == 1

    def energies(name):
        return np.array([json.loads(line)["energy"] for line in (tmp_path / name / "metrics.jsonl").open()])

    assert len(energies("single")) == 8 and np.all(np.isfinite(energies("single")))
    if case.startswith("sr_"):
        np.testing.assert_array_equal(energies("sharded"), energies("single"))
        assert four["energy"] == one["energy"]
    else:
        np.testing.assert_allclose(energies("sharded"), energies("single"), rtol=1e-10)
        np.testing.assert_allclose(four["energy"], one["energy"], rtol=1e-10)
