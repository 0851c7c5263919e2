"""Restricted Boltzmann machine wavefunction."""

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from models.common import check_param_dtype, log_cosh, log_cosh_real_part, normal, real_times
from runner.errors import ConfigError


class RBM(nn.Module):
    """log psi(s) = a.s + sum_j log cosh(b_j + W_j.s), with alpha*N hidden units."""

    alpha: float = 1.0
    """Hidden-unit density: the number of hidden units is round(alpha * N)."""
    use_visible_bias: bool = True
    """Include the visible bias a."""
    param_dtype: Any = jnp.float64
    """Parameter dtype; complex dtypes give a complex (holomorphic) wavefunction."""

    holomorphic = True  # log psi is holomorphic in complex parameters (not a field)

    def __post_init__(self):
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not self.alpha > 0:
            raise ConfigError("alpha", f"must be a positive number (got {self.alpha!r})")
        if not isinstance(self.use_visible_bias, bool):
            raise ConfigError("use_visible_bias", f"must be true or false (got {self.use_visible_bias!r})")
        check_param_dtype(self.param_dtype)
        super().__post_init__()

    @nn.compact
    def features(self, sigma_xN):
        """Hidden pre-activations theta [..., M] and the visible term a.s [...]."""
        n = sigma_xN.shape[-1]
        n_hidden = max(1, int(round(self.alpha * n)))
        kernel = self.param("kernel", normal(0.01), (n, n_hidden), self.param_dtype)
        hidden_bias = self.param("hidden_bias", normal(0.01), (n_hidden,), self.param_dtype)
        x = sigma_xN.astype(jnp.finfo(self.param_dtype).dtype)  # spins are real
        theta = real_times(x, kernel) + hidden_bias
        if not self.use_visible_bias:
            return theta, jnp.zeros(x.shape[:-1], self.param_dtype)
        visible_bias = self.param("visible_bias", normal(0.01), (n,), self.param_dtype)
        return theta, real_times(x, visible_bias)

    def __call__(self, sigma_xN):
        theta, visible = self.features(sigma_xN)
        return jnp.sum(log_cosh(theta), axis=-1) + visible

    def log_abs(self, sigma_xN):
        """Re log psi, cheaper than the real part of __call__ for complex parameters."""
        theta, visible = self.features(sigma_xN)
        return jnp.sum(log_cosh_real_part(theta), axis=-1) + jnp.real(visible)
