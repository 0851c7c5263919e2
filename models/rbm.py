"""Restricted Boltzmann machine wavefunction."""

from typing import Any

import flax.linen as nn
import jax
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
        params = {
            "kernel": self.param("kernel", normal(0.01), (n, n_hidden), self.param_dtype),
            "hidden_bias": self.param("hidden_bias", normal(0.01), (n_hidden,), self.param_dtype),
        }
        if self.use_visible_bias:
            params["visible_bias"] = self.param("visible_bias", normal(0.01), (n,), self.param_dtype)
        return self.local_state(self.local_tables(params), sigma_xN)

    def __call__(self, sigma_xN):
        return self.local_log_psi(self.features(sigma_xN))

    def log_abs(self, sigma_xN):
        """Re log psi, cheaper than the real part of __call__ for complex parameters."""
        return self.local_log_abs(self.features(sigma_xN))

    # --- local updates: O(K M) per move of K spins instead of O(N M), for the Metropolis
    # sampler and the local energies; pure functions of the parameter dict ---------------

    @staticmethod
    def local_tables(params):
        """The parameters the updates read (the visible bias is zero when unused)."""
        kernel = params["kernel"]
        zeros = jnp.zeros(kernel.shape[0], kernel.dtype)
        return {"kernel": kernel, "hidden_bias": params["hidden_bias"],
                "visible_bias": params.get("visible_bias", zeros)}

    @staticmethod
    def local_state(tables, sigma_xN):
        """(theta, a.s): hidden pre-activations [..., M] and the visible term [...]."""
        kernel = tables["kernel"]
        x = sigma_xN.astype(jnp.finfo(kernel.dtype).dtype)  # spins are real
        return real_times(x, kernel) + tables["hidden_bias"], real_times(x, tables["visible_bias"])

    @staticmethod
    def local_update(tables, state, sites_xK, delta_xK):
        """The `local_state` after the spins on `sites` change by `delta` (new - old)."""
        theta, visible = state
        delta = delta_xK.astype(jnp.finfo(tables["kernel"].dtype).dtype)
        theta = theta + jnp.sum(delta[..., None] * tables["kernel"][sites_xK], axis=-2)
        return theta, visible + jnp.sum(delta * tables["visible_bias"][sites_xK], axis=-1)

    @staticmethod
    def local_log_abs(state):
        """Re log psi of a `local_state` (one log per block of hidden units)."""
        theta, visible = state
        return sum_log_cosh_real_part(theta) + jnp.real(visible)

    @staticmethod
    def local_ratios(tables, state, sites_KxJ, delta_KxJ):
        """psi(s'_k) / psi(s) for K moves of a `local_state`, each flipping the J spins
        `sites_KxJ[k]` (delta = new - old = +-2).

        No transcendental per hidden unit and move: the move shifts theta by
        D = sum_J delta W[site], cosh(theta + D) / cosh(theta) = cosh D + tanh(theta) sinh D,
        and cosh D, sinh D compose from the tables cosh(2 W), sinh(2 W) by the addition
        theorems (the tables depend on the parameters only, so they are built once per batch).
        Local energies of the 6x6 Ising case (2048 samples x 36 flips x 36 units): 2.0 ms, against
        5.8 ms through log cosh of the updated theta; the complex 16-site Heisenberg case 2.2
        against 9.5 ms.
        """
        theta, _ = state
        kernel = tables["kernel"]
        u = (delta_KxJ // 2).astype(jnp.finfo(kernel.dtype).dtype)  # +-1
        cosh_2w, sinh_2w = jnp.cosh(2 * kernel), jnp.sinh(2 * kernel)
        c, s = cosh_2w[sites_KxJ[:, 0]], u[:, :1] * sinh_2w[sites_KxJ[:, 0]]
        for j in range(1, sites_KxJ.shape[1]):
            c_j, s_j = cosh_2w[sites_KxJ[:, j]], u[:, j : j + 1] * sinh_2w[sites_KxJ[:, j]]
            c, s = c * c_j + s * s_j, s * c_j + c * s_j
        visible = jnp.exp(jnp.sum(u * tables["visible_bias"][sites_KxJ], axis=-1) * 2)
        return visible * jnp.prod(c + jnp.tanh(theta)[None, :] * s, axis=-1)

    @staticmethod
    def jacobian_products(params, sigma_SxN):
        """(jvp, transpose) of log psi over a batch, in the parameters: jvp maps a parameter
        pytree dp to d log psi [S]; transpose maps c [S] to the pytree sum_s c_s O_s (linear,
        no conjugation). Written out, it is about a quarter faster than jax.linearize's, which
        matters in SR's conjugate gradients (two of these per iteration)."""
        tables = RBM.local_tables(params)
        kernel = tables["kernel"]
        x = sigma_SxN.astype(jnp.finfo(kernel.dtype).dtype)
        t = jnp.tanh(RBM.local_state(tables, sigma_SxN)[0])  # d log cosh / d theta
        x_T = jax.lax.optimization_barrier(x.T)
        has_visible = "visible_bias" in params

        def jvp(dp):
            d_theta = real_times(x, dp["kernel"]) + dp["hidden_bias"]
            out = jnp.sum(t * d_theta, axis=-1)
            return out + real_times(x, dp["visible_bias"]) if has_visible else out

        def transpose(c_S):
            tc = t * c_S[:, None]
            dp = {"kernel": real_times(x_T, tc), "hidden_bias": jnp.sum(tc, axis=0)}
            if has_visible:
                dp["visible_bias"] = real_times(x_T, c_S)
            return dp

        return jvp, transpose

    @staticmethod
    def local_log_psi(state):
        """log psi of a `local_state`."""
        theta, visible = state
        return sum_log_cosh(theta) + visible
