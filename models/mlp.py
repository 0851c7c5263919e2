"""Feed-forward wavefunction."""

import math
from typing import Any, Sequence

import flax.linen as nn
import jax.numpy as jnp

from models.common import attached, check_param_dtype, log_cosh, normal, sum_log_cosh, sum_log_cosh_real_part
from runner.errors import ConfigError


class MLP(nn.Module):
    """log psi(s) = sum over the last layer of log cosh(Dense(...log cosh(Dense(s))...))."""

    hidden: Sequence[int] = (16,)
    """Widths of the hidden layers (at least one)."""
    param_dtype: Any = jnp.float64
    """Parameter dtype; complex dtypes give a complex (holomorphic) wavefunction."""

    holomorphic = True  # log psi is holomorphic in complex parameters (not a field)

    def __post_init__(self):
        widths = list(self.hidden) if isinstance(self.hidden, (list, tuple)) else None
        if not widths or any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in widths):
            raise ConfigError("hidden", f"must be a non-empty list of positive integers (got {self.hidden!r})")
        object.__setattr__(self, "hidden", tuple(widths))
        check_param_dtype(self.param_dtype)
        super().__post_init__()

    @nn.compact
    def features(self, sigma_xN):
        """Pre-activations of the last layer [..., hidden[-1]]."""
        x = sigma_xN.astype(self.param_dtype)
        for i, width in enumerate(self.hidden):
            if i:
                x = log_cosh(x)
            x = nn.Dense(
                width,
                param_dtype=self.param_dtype,
                dtype=self.param_dtype,
                kernel_init=normal(1.0 / math.sqrt(x.shape[-1])),
                bias_init=normal(0.01),
            )(x)
        return x

    def plus_x(self, params):
        """The parameters of the uniform state from those of an initialisation: unit j of the first
        layer sees site j mod N alone (`models.common.attached`) with zero bias, so every later
        layer's input is the same on every configuration, and the log-derivatives in the first
        kernel hold every two-body term s_j s_k."""
        first = params["Dense_0"]
        return {**params, "Dense_0": {"kernel": attached(first["kernel"]), "bias": jnp.zeros_like(first["bias"])}}

    def __call__(self, sigma_xN):
        return sum_log_cosh(self.features(sigma_xN))

    def log_abs(self, sigma_xN):
        """Re log psi, cheaper than the real part of __call__ for complex parameters."""
        return sum_log_cosh_real_part(self.features(sigma_xN))
