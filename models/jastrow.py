"""Two-body Jastrow wavefunction."""

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from models.common import check_param_dtype, normal


class Jastrow(nn.Module):
    """log psi(s) = sum_{i<j} s_i W_ij s_j with a free pair coupling W_ij for each i < j."""

    param_dtype: Any = jnp.float64
    """Parameter dtype; complex dtypes give a complex (holomorphic) wavefunction."""

    holomorphic = True  # log psi is holomorphic in complex parameters (not a field)

    def __post_init__(self):
        check_param_dtype(self.param_dtype)
        super().__post_init__()

    def plus_x(self, params):
        """The parameters of the uniform state: every coupling zero (the log-derivatives s_i s_j hold
        every two-body response)."""
        return jax.tree_util.tree_map(jnp.zeros_like, params)

    @nn.compact
    def __call__(self, sigma_xN):
        n = sigma_xN.shape[-1]
        i, j = jnp.triu_indices(n, k=1)
        w = self.param("pair_coupling", normal(0.01), (len(i),), self.param_dtype)
        x = sigma_xN.astype(self.param_dtype)
        return (x[..., i] * x[..., j]) @ w


def displacement_table(shape: tuple, n_basis: int) -> np.ndarray:
    """[N, N] for sites i, j the row of a [N, n_basis] displacement kernel w that couples them,
    flattened: w[j', b_i] with j' the site j moved by the translation that takes i's cell to cell 0
    (cells wrapped around the torus), b_i the basis site of i; on the diagonal N n_basis, the
    index of a padding zero (s_i^2 = 1 is not a coupling). Site index (x Ly + y) n_basis + b."""
    cells = np.stack(np.unravel_index(np.arange(math.prod(shape)), shape), axis=-1)  # [C, d]
    n = len(cells) * n_basis
    cell, basis = np.arange(n) // n_basis, np.arange(n) % n_basis
    moved = (cells[cell][None, :, :] - cells[cell][:, None, :]) % np.asarray(shape)  # [i, j, d]
    j_moved = np.ravel_multi_index(tuple(np.moveaxis(moved, -1, 0)), shape) * n_basis + basis[None, :]
    table = j_moved * n_basis + basis[:, None]
    np.fill_diagonal(table, n * n_basis)
    return table.astype(np.int32)


def by_displacement(x_xN, kernel_NxB, table_NxN):
    """The translation-invariant two-body Jastrow exponent 1/2 sum_{i != j} x_i J_ij x_j [...],
    J_ij = kernel[`displacement_table`[i, j]]: a coupling per basis site and displacement."""
    padded = jnp.concatenate([kernel_NxB.reshape(-1), jnp.zeros((1,), kernel_NxB.dtype)])
    coupling_NxN = padded[table_NxN]
    return 0.5 * jnp.sum((x_xN @ coupling_NxN) * x_xN, axis=-1)
