"""Two-body Jastrow wavefunction."""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

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
