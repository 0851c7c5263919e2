"""Determinants and solves of small matrices by elimination (models.small_linalg) against
LAPACK through numpy, and the determinant's programs free of LAPACK calls."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import small_linalg
from models.determinant import Determinant
from models.rbm import RBM
from runner.core import excited
from runner.physics import hamiltonians, hilbert as hb


def _matrices(dtype, K, rng):
    A = rng.normal(size=(40, K, K))
    if dtype == np.complex128:
        A = A + 1j * rng.normal(size=A.shape)
    if K > 1:
        A[0, 0, 0] = 0  # the first pivot must come from another row
        A[1] = A[1][::-1]  # a permuted triangular-ish case
    return A.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
@pytest.mark.parametrize("K", [1, 2, 3, 5])
def test_log_det_and_solve_are_lapacks(dtype, K):
    rng = np.random.default_rng(K)
    A = _matrices(dtype, K, rng)
    sign, log_abs = np.linalg.slogdet(A)
    assert np.allclose(np.exp(np.asarray(small_linalg.log_det(A))), sign * np.exp(log_abs), rtol=1e-10, atol=0)
    B = rng.normal(size=(40, K, 3)).astype(dtype)
    assert np.allclose(np.asarray(small_linalg.solve(A, B)), np.linalg.solve(A, B), rtol=1e-9, atol=1e-11)


def test_a_singular_matrix_has_log_det_minus_infinity():
    assert np.isneginf(np.real(complex(small_linalg.log_det(jnp.ones((3, 3))))))
    assert np.isneginf(np.real(complex(small_linalg.log_det(jnp.zeros((2, 2))))))


def test_log_det_is_holomorphic_with_lapacks_derivative():
    rng = np.random.default_rng(0)
    A = jnp.asarray(rng.normal(size=(4, 4)) + 1j * rng.normal(size=(4, 4)))
    ours = jax.grad(small_linalg.log_det, holomorphic=True)(A)
    lapack = jax.grad(lambda a: jnp.log(jnp.linalg.det(a)), holomorphic=True)(A)
    assert np.allclose(ours, lapack, rtol=1e-12)
    assert np.allclose(ours, np.linalg.inv(np.asarray(A)).T, rtol=1e-12)


def test_the_determinants_programs_call_no_lapack():
    """LAPACK's batched LU on CPU can hang a 2-core machine (module docstring of small_linalg): the
    determinant's log psi, its gradient and the local energy matrices must not call it."""
    n, K = 6, 3
    space = hb.chain(n)
    ham = hamiltonians.ising(space, h=0.5)  # of one copy: local_matrices applies it to each
    model = Determinant(RBM(alpha=1, param_dtype=jnp.complex128), n_states=K)
    sigma = jnp.ones((2, 4, K * n), jnp.int8)
    params = model.init(jax.random.PRNGKey(0), sigma[0, 0])["params"]
    log_psi = lambda p, s: model.apply({"params": p}, s)  # noqa: E731
    each = lambda p, s: model.apply({"params": p}, s, method=model.each)  # noqa: E731
    programs = [
        jax.jit(log_psi).lower(params, sigma),
        jax.jit(jax.grad(lambda p: jnp.real(log_psi(p, sigma)).sum())).lower(params),
        jax.jit(lambda p, s: excited.local_matrices(ham, each, p, s, K)).lower(params, sigma),
    ]
    for program in programs:
        text = program.as_text().lower()
        assert "lapack" not in text and "getrf" not in text
