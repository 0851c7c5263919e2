"""Restricted Boltzmann machine wavefunction."""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from models import symmetrize
from models.common import attached, check_param_dtype, normal, real_times, sum_log_cosh, sum_log_cosh_real_part
from models.fast_paths import JacobianProducts, LocalRatios, SamplerCache
from runner.errors import ConfigError, require_bool


class RBM(nn.Module):
    """log psi(s) = a.s + sum_j log cosh(b_j + W_j.s), with alpha*N hidden units."""

    alpha: float = 1.0
    """Hidden-unit density: the number of hidden units is round(alpha * N)."""
    use_visible_bias: bool = True
    """Include the visible bias a."""
    param_dtype: Any = jnp.float64
    """Parameter dtype; complex dtypes give a complex (holomorphic) wavefunction."""
    sector: Any = None
    """The symmetry sector projected onto: None (no projection), a `runner.physics.symmetry.Sector`
    or {momentum, irrep, parity}; held as a `models.symmetrize.Projection` (every sector of the
    lattice: the RBM has no symmetry of its own)."""
    hilbert: Any = None
    """The lattice (given by the runner), read only to resolve `sector`; not kept."""

    holomorphic = True  # log psi is holomorphic in complex parameters (not a field)
    # Opted into explicitly (`models.fast_paths.resolve`); a subclass must declare its own.
    fast_paths = (LocalRatios, SamplerCache, JacobianProducts)

    def __post_init__(self):
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not self.alpha > 0:
            raise ConfigError("alpha", f"must be a positive number (got {self.alpha!r})")
        require_bool("use_visible_bias", self.use_visible_bias)
        check_param_dtype(self.param_dtype)
        object.__setattr__(self, "sector", symmetrize.projection_of(self.sector, self.hilbert))
        object.__setattr__(self, "hilbert", None)
        super().__post_init__()

    def fast_paths_apply(self) -> tuple:
        """All of them without projection; with one, the local ratios (of the projection, from
        those of `unprojected`), the sampler and the Jacobian products taking the generic paths."""
        return (LocalRatios,) if symmetrize.projects(self.sector) else self.fast_paths

    def plus_x(self, params):
        """The parameters of the uniform state from those of an initialisation: hidden unit j sees
        site j mod N alone (`models.common.attached`), every bias zero, so psi is uniform and the
        log-derivatives in W hold every two-body term s_j s_k (at W = 0 they are linear in the
        spins: the quench would stay frozen)."""
        out = {"kernel": attached(params["kernel"]), "hidden_bias": jnp.zeros_like(params["hidden_bias"])}
        return {**out, "visible_bias": jnp.zeros_like(params["visible_bias"])} if "visible_bias" in params else out

    @nn.compact
    def features(self, sigma_xN):
        """Hidden pre-activations theta [..., M] and the visible term a.s [...]."""
        n = sigma_xN.shape[-1]
        n_hidden = max(1, int(round(self.alpha * n)))
        # Projected, psi starts at weights of order 1/sqrt(N): from near-constant weights a sector
        # whose characters cancel would keep only psi's first-order fluctuation, a spin wave near
        # the ferromagnet (docs/notes/experiments.md).
        kernel_scale = 1 / n**0.5 if symmetrize.projects(self.sector) else 0.01
        params = {
            "kernel": self.param("kernel", normal(kernel_scale), (n, n_hidden), self.param_dtype),
            "hidden_bias": self.param("hidden_bias", normal(0.01), (n_hidden,), self.param_dtype),
        }
        if self.use_visible_bias:
            params["visible_bias"] = self.param("visible_bias", normal(0.01), (n,), self.param_dtype)
        return self.local_state(self.local_tables(params), sigma_xN)

    def unprojected(self, sigma_xN):
        """log psi before the symmetry projection [...]."""
        return self.local_log_psi(self.features(sigma_xN))

    def __call__(self, sigma_xN):
        return symmetrize.project(self.unprojected, sigma_xN, self.sector)

    def log_abs(self, sigma_xN):
        """Re log psi, cheaper than the real part of __call__ for complex parameters."""
        if symmetrize.projects(self.sector):
            return jnp.real(self(sigma_xN))
        return self.local_log_abs(self.features(sigma_xN))

    # --- local updates: O(K M) per move of K spins instead of O(N M), for the Metropolis
    # sampler and the local energies; pure functions of the parameter dict ---------------

    @staticmethod
    def local_tables(params):
        """The parameters the updates read (the visible bias is zero when unused), and the
        cosh(2 W), sinh(2 W) tables of `local_flip`: built once per batch or sampling call,
        outside the Markov loop (unused ones cost nothing: XLA drops them)."""
        kernel = params["kernel"]
        zeros = jnp.zeros(kernel.shape[0], kernel.dtype)
        return {"kernel": kernel, "hidden_bias": params["hidden_bias"],
                "visible_bias": params.get("visible_bias", zeros),
                "cosh_2w": jnp.cosh(2 * kernel), "sinh_2w": jnp.sinh(2 * kernel)}

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
    def local_flip(tables, t, sites_xJ, delta_xJ, all_flip=False):
        """A move of J spins (`delta` = new - old, each +-2, or 0 unless `all_flip`) from a
        configuration with tanh(theta) = t [..., M], without a transcendental per hidden unit.

        The move shifts theta by D = sum_J delta W[site]; cosh(theta + D) / cosh(theta) =
        cosh D + t sinh D, and tanh(theta + D) = (t cosh D + sinh D) / (cosh D + t sinh D),
        with cosh D, sinh D composed from the tables cosh(2 W), sinh(2 W) of `local_tables` by
        the addition theorems.

        Returns:
            (product of the M cosh ratios [...], the visible exponent sum delta a [...],
            tanh(theta) after the move [..., M]); psi'/psi = exp(exponent) * product.
        """
        u = (delta_xJ // 2).astype(jnp.finfo(tables["kernel"].dtype).dtype)  # +-1, 0 if unchanged
        cosh_2w, sinh_2w = tables["cosh_2w"], tables["sinh_2w"]
        c = s = None
        for j in range(sites_xJ.shape[-1]):
            u_j = u[..., j : j + 1]
            c_j = cosh_2w[sites_xJ[..., j]]  # the same for all samples when every spin flips
            if not all_flip:
                c_j = 1.0 + u_j * u_j * (c_j - 1.0)
            s_j = u_j * sinh_2w[sites_xJ[..., j]]
            c, s = (c_j, s_j) if c is None else (c * c_j + s * s_j, s * c_j + c * s_j)
        f = c + t * s
        exponent = 2.0 * jnp.sum(u * tables["visible_bias"][sites_xJ], axis=-1)
        return jnp.prod(f, axis=-1), exponent, (t * c + s) / f

    @staticmethod
    def local_ratios(tables, state, sites_KxJ, delta_KxJ):
        """psi(s'_k) / psi(s) for K moves of a `local_state` (see `local_flip`): no
        transcendental per hidden unit and move, unlike log cosh of the updated theta."""
        t = jnp.tanh(state[0])[None, :]
        product, exponent, _ = RBM.local_flip(tables, t, sites_KxJ, delta_KxJ, all_flip=True)
        return jnp.exp(exponent) * product

    # --- the Metropolis sampler's cache ------------------------------------------------------
    # Real parameters: tanh(theta) and log |psi|, moved by `local_flip`. Complex ones: theta and
    # a.s, with log |psi| from `local_log_abs` (the complex products and divisions of
    # `local_flip` cost more than that). Timings in docs/notes/benchmarks.md.

    @staticmethod
    def sampler_init(tables, sigma_CxN):
        """(log |psi| [C], cache) of the chains' configurations."""
        state = RBM.local_state(tables, sigma_CxN)
        log_abs = RBM.local_log_abs(state)
        if jnp.iscomplexobj(tables["kernel"]):
            return log_abs, state
        return log_abs, (jnp.tanh(state[0]), log_abs)

    @staticmethod
    def sampler_update(tables, cache, sites_CxK, delta_CxK):
        """(log |psi| [C], cache) after the proposed moves (spins on `sites` change by `delta`)."""
        if jnp.iscomplexobj(tables["kernel"]):
            state = RBM.local_update(tables, cache, sites_CxK, delta_CxK)
            return RBM.local_log_abs(state), state
        t, log_abs = cache
        product, exponent, t = RBM.local_flip(tables, t, sites_CxK, delta_CxK)
        log_abs = log_abs + jnp.log(jnp.abs(product)) + exponent
        return log_abs, (t, log_abs)

    @staticmethod
    def jacobian_products(params, sigma_CxTxN):
        """(jvp, transpose) of log psi over a batch of C chains of T samples, in the parameters:
        jvp maps a parameter pytree dp to d log psi [C, T]; transpose maps c [C, T] to the
        per-chain sums sum_t c_ct O_ct, a pytree whose leaves have a leading axis C (linear, no
        conjugation). Per-chain sums (combined by the caller in a fixed order) keep the result
        independent of how chains are spread over devices. Written out rather than through
        jax.linearize: tanh and x^T computed once, which matters in SR's conjugate gradients
        (two products per iteration)."""
        tables = RBM.local_tables(params)
        kernel = tables["kernel"]
        x = sigma_CxTxN.astype(jnp.finfo(kernel.dtype).dtype)
        t = jnp.tanh(RBM.local_state(tables, sigma_CxTxN)[0])  # d log cosh / d theta [C, T, M]
        x_T = jax.lax.optimization_barrier(jnp.swapaxes(x, 1, 2))  # [C, N, T]
        has_visible = "visible_bias" in params

        def jvp(dp):
            d_theta = real_times(x, dp["kernel"]) + dp["hidden_bias"]
            out = jnp.sum(t * d_theta, axis=-1)
            return out + real_times(x, dp["visible_bias"]) if has_visible else out

        def transpose(c_CxT):
            tc = t * c_CxT[..., None]
            dp = {"kernel": real_times(x_T, tc), "hidden_bias": jnp.sum(tc, axis=1)}
            if has_visible:
                dp["visible_bias"] = real_times(x_T, c_CxT[..., None])[..., 0]
            return dp

        return jvp, transpose

    @staticmethod
    def local_log_psi(state):
        """log psi of a `local_state`."""
        theta, visible = state
        return sum_log_cosh(theta) + visible
