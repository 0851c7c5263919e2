"""runner.physics.exact.lowest_levels, the one eigensolver of levels (a whole space's, a symmetry
sector's, an invariant subspace's): numpy's dense levels below and above DENSE_MAX_STATES."""

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse.linalg import LinearOperator

from runner.physics import exact, hamiltonians, spectrum
from runner.physics import hilbert as hb


def _hermitian(d: int, complex_: bool, seed: int = 0):
    """A sparse Hermitian [d, d]: a random graph's couplings (complex ones with `complex_`) and a
    random diagonal, so the lowest levels are spread and generic."""
    rng = np.random.default_rng(seed)
    a = sp.random(d, d, density=min(1.0, 8 / d), random_state=rng, format="csr")
    if complex_:
        a = a + 1j * sp.random(d, d, density=min(1.0, 8 / d), random_state=rng, format="csr")
    return (a + a.conj().T + sp.diags(rng.uniform(-1, 1, d))).tocsr()


def _as_operator(matrix) -> LinearOperator:
    return LinearOperator(matrix.shape, matvec=lambda v: matrix @ v, dtype=matrix.dtype)


def _sparse_calls(monkeypatch) -> list:
    calls, real = [], exact.eigsh
    monkeypatch.setattr(exact, "eigsh", lambda *a, **k: calls.append(a[0].shape) or real(*a, **k))
    return calls


@pytest.mark.parametrize("form", [lambda m: m, _as_operator], ids=["sparse", "operator"])
@pytest.mark.parametrize("complex_", [False, True], ids=["real", "complex"])
@pytest.mark.parametrize("offset", [-1, 0, 1, 200])
def test_the_levels_are_numpys_on_both_sides_of_the_dense_threshold(monkeypatch, form, complex_, offset):
    """Dense up to DENSE_MAX_STATES states, ARPACK past it; either way numpy's eigvalsh, for a
    sparse matrix (a sector's) and a LinearOperator (a whole space's, matrix-free)."""
    d = exact.DENSE_MAX_STATES + offset
    matrix = _hermitian(d, complex_)
    calls = _sparse_calls(monkeypatch)
    levels = exact.lowest_levels(form(matrix), 4)
    np.testing.assert_allclose(levels, np.linalg.eigvalsh(matrix.toarray())[:4], rtol=1e-10, atol=1e-10)
    assert len(calls) == (offset > 0) and all(isinstance(x, float) for x in levels)


@pytest.mark.parametrize("form", [lambda m: m, _as_operator], ids=["sparse", "operator"])
@pytest.mark.parametrize("complex_", [False, True], ids=["real", "complex"])
def test_the_lowest_level_alone_is_plain_lanczos_past_the_dense_threshold(monkeypatch, form, complex_):
    """One level of more than DENSE_MAX_STATES states: `lanczos`, not ARPACK, numpy's lowest to 1e-10."""
    matrix = _hermitian(exact.DENSE_MAX_STATES + 200, complex_, seed=2)
    calls = _sparse_calls(monkeypatch)
    levels = exact.lowest_levels(form(matrix), 1)
    np.testing.assert_allclose(levels, np.linalg.eigvalsh(matrix.toarray())[:1], rtol=1e-10, atol=1e-10)
    assert calls == [] and isinstance(levels[0], float)


def test_all_levels_an_empty_matrix_and_nearly_all_levels_are_dense(monkeypatch):
    calls = _sparse_calls(monkeypatch)
    d = exact.DENSE_MAX_STATES + 5
    matrix = _hermitian(d, True, seed=1)
    want = np.linalg.eigvalsh(matrix.toarray())
    np.testing.assert_allclose(exact.lowest_levels(matrix, None), want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(exact.lowest_levels(matrix, d - 1), want[:-1], rtol=1e-12, atol=1e-12)
    assert exact.lowest_levels(sp.csr_matrix((0, 0)), 3) == [] and calls == []


@pytest.mark.parametrize("make", [
    lambda: hb.chain(10, total_sz=0),  # 252 states: dense
    lambda: hb.chain(12, total_sz=0),  # 924 states: ARPACK
])
def test_a_space_and_its_sectors_give_the_same_levels(make):
    """A Heisenberg chain's 6 lowest levels (degenerate multiplets across momenta) matrix-free on
    the whole S^z = 0 space equal those of its sectors, merged with their stars' multiplicities,
    and numpy's dense ones."""
    space = make()
    ham = hamiltonians.heisenberg(space, 1.0, 0.0, "none")
    whole = exact.lowest_levels(exact.operator(ham, space), 6)
    by_sector = spectrum.spectrum(ham, space, n_levels=6)
    merged = sorted(x for s, v in by_sector.levels.items() for x in v * by_sector.star_sizes[s])[:6]
    dense = np.stack([exact.operator(ham, space).matvec(e) for e in np.eye(space.n_states)], axis=1)
    np.testing.assert_allclose(whole, np.linalg.eigvalsh(dense)[:6], atol=1e-9)
    np.testing.assert_allclose(merged, whole, atol=1e-9)
