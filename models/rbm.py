"""Restricted Boltzmann machine wavefunction."""

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from models.common import check_param_dtype, normal, real_times, sum_log_cosh, sum_log_cosh_real_part
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
        return sum_log_cosh(theta) + visible

    def log_abs(self, sigma_xN):
        """Re log psi, cheaper than the real part of __call__ for complex parameters."""
        return self.log_abs_of_features(*self.features(sigma_xN))

    @staticmethod
    def log_abs_of_features(theta, visible):
        """Re log psi from the `features` (theta, a.s)."""
        return sum_log_cosh_real_part(theta) + jnp.real(visible)

    def features_change(self, sites_xK, delta_xK):
        """Change of the `features` when spins on `sites` change by `delta` (new - old).

        O(K M) instead of the O(N M) of recomputing theta: what a Metropolis move needs.
        """
        params = self.variables["params"]
        delta = delta_xK.astype(jnp.finfo(self.param_dtype).dtype)
        d_theta = jnp.sum(delta[..., None] * params["kernel"][sites_xK], axis=-2)
        if not self.use_visible_bias:
            return d_theta, jnp.zeros(delta.shape[:-1], self.param_dtype)
        return d_theta, jnp.sum(delta * params["visible_bias"][sites_xK], axis=-1)
