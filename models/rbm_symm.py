"""Translation-symmetric restricted Boltzmann machine."""

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from models import symmetrize
from models.common import check_param_dtype, normal, real_times, sum_log_cosh
from runner.errors import ConfigError


class RBMSymm(nn.Module):
    """log psi(s) = a sum_i s_i + sum_{f, t} log cosh(b_f + sum_i W_fi s_{T_t(i)}): each of the
    `alpha` features has one weight vector and bias, shared by its hidden units over the T
    lattice translations, so log psi is invariant under them."""

    alpha: int = 1
    """Features: the number of hidden units is alpha * T (T translations of the lattice)."""
    symmetries: str = "none"
    """Symmetry projection on top: none or translations (see `models.symmetrize`)."""
    parity: int | None = None
    """Spin-flip parity of the projected state: null (none), 1 or -1. (No momentum key: log psi is
    translation invariant already, and its projection onto any q != 0 vanishes.)"""
    param_dtype: Any = jnp.float64
    """Parameter dtype; complex dtypes give a complex (holomorphic) wavefunction."""
    hilbert: Any = None
    """The lattice (given by the runner); held as a `models.symmetrize.Lattice`."""

    holomorphic = True  # log psi is holomorphic in complex parameters (not a field)

    def __post_init__(self):
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, int) or self.alpha < 1:
            raise ConfigError("alpha", f"must be a positive integer (got {self.alpha!r})")
        check_param_dtype(self.param_dtype)
        object.__setattr__(self, "hilbert", symmetrize.lattice_of(self.hilbert))
        symmetrize.check_keys(self.symmetries, self.parity, None, self.hilbert)
        super().__post_init__()

    @nn.compact
    def unprojected(self, sigma_xN):
        """log psi before the symmetry projection [...]."""
        n = sigma_xN.shape[-1]
        kernel_NxF = self.param("kernel", normal(0.1 / n**0.5), (n, self.alpha), self.param_dtype)
        bias_F = self.param("hidden_bias", normal(0.01), (self.alpha,), self.param_dtype)
        visible = self.param("visible_bias", normal(0.01), (), self.param_dtype)
        x_xN = sigma_xN.astype(jnp.finfo(self.param_dtype).dtype)  # spins are real
        x_xTxN = x_xN[..., self.hilbert.translations_TxN]
        theta_xTxF = real_times(x_xTxN, kernel_NxF) + bias_F
        theta_xM = theta_xTxF.reshape(*theta_xTxF.shape[:-2], -1)
        return sum_log_cosh(theta_xM) + visible * jnp.sum(x_xN, axis=-1)

    def __call__(self, sigma_xN):
        return symmetrize.project(self.unprojected, sigma_xN, self.hilbert, self.symmetries, self.parity, None)
