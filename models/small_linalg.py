"""Determinants and linear solves of many small matrices [..., K, K], written as K steps of
Gauss-Jordan elimination with partial pivoting in jnp.

`jnp.linalg.slogdet` and `jnp.linalg.solve` call LAPACK's LU through a CPU custom call that
splits a batch over XLA's intra-op thread pool and waits for the pieces on a pool thread; when
as many of those calls run at once as the pool has threads (2 on a 2-core machine), every thread
waits and the program hangs without a word. For the K of a few states the elimination unrolled
over K is plain elementwise code: no custom call, no thread pool, any batch shape, and autodiff
(holomorphic where the entries are) through every step.
"""

import jax
import jax.numpy as jnp


def _pivot(A_xKxK, B_xKxR, j: int):
    """Rows j and p swapped in A and B (picked by selects), p >= j the row of the largest |A[p, j]|;
    and whether p != j."""
    K = A_xKxK.shape[-1]
    rows_K = jnp.arange(K)
    below_xK = jnp.where(rows_K >= j, jnp.abs(jax.lax.stop_gradient(A_xKxK[..., :, j])), -1.0)
    is_p_xK = rows_K == jnp.argmax(below_xK, axis=-1)[..., None]

    def swap(M_xKxR):
        row_p = jnp.sum(jnp.where(is_p_xK[..., None], M_xKxR, 0), axis=-2, keepdims=True)
        row_j = M_xKxR[..., j:j + 1, :]
        return jnp.where((rows_K == j)[:, None], row_p, jnp.where(is_p_xK[..., None], row_j, M_xKxR))

    return swap(A_xKxK), swap(B_xKxR), ~is_p_xK[..., j]


def _eliminate(A_xKxK, B_xKxR):
    """(the pivots [..., K], the number of row swaps [...], A^-1 B [..., K, R] where A is regular)."""
    K = A_xKxK.shape[-1]
    pivots, swaps = [], jnp.zeros(A_xKxK.shape[:-2], jnp.int32)
    for j in range(K):
        A_xKxK, B_xKxR, swapped = _pivot(A_xKxK, B_xKxR, j)
        swaps = swaps + swapped
        pivots.append(A_xKxK[..., j, j])
        pivot_x = jnp.where(pivots[-1] == 0, 1, pivots[-1])  # singular: the determinant is 0 all the same
        row_A, row_B = A_xKxK[..., j, :] / pivot_x[..., None], B_xKxR[..., j, :] / pivot_x[..., None]
        factor_xK = jnp.where(jnp.arange(K) == j, 0, A_xKxK[..., :, j])
        A_xKxK = A_xKxK - factor_xK[..., :, None] * row_A[..., None, :]
        B_xKxR = B_xKxR - factor_xK[..., :, None] * row_B[..., None, :]
        A_xKxK = A_xKxK.at[..., j, :].set(row_A)
        B_xKxR = B_xKxR.at[..., j, :].set(row_B)
    return jnp.stack(pivots, axis=-1), swaps, B_xKxR


def log_det(A_xKxK):
    """log det A [...], complex (its imaginary part is the phase, up to a multiple of 2 pi); a
    singular matrix gives -inf."""
    empty = jnp.zeros((*A_xKxK.shape[:-1], 0), A_xKxK.dtype)
    pivots_xK, swaps, _ = _eliminate(A_xKxK, empty)
    complex_dtype = jnp.result_type(A_xKxK.dtype, jnp.complex64)
    return jnp.sum(jnp.log(pivots_xK.astype(complex_dtype)), axis=-1) + 1j * jnp.pi * (swaps % 2)


def solve(A_xKxK, B_xKxR):
    """X [..., K, R] with A X = B."""
    return _eliminate(A_xKxK, B_xKxR)[2]
