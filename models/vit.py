"""Small vision transformer on lattice patches (after Viteritti, Rende and Becca), complex log psi."""

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from models import symmetrize
from models.common import check_param_dtype, log_cosh, normal, sum_log_cosh
from runner.errors import ConfigError


def _dense(features, dtype, name=None, gain=1.0):
    return nn.Dense(features, param_dtype=dtype, dtype=dtype, name=name,
                    kernel_init=lambda key, shape, d: normal(gain / math.sqrt(shape[0]))(key, shape, d),
                    bias_init=normal(0.01))


def softmax(logits_xK):
    """Softmax over the last axis; holomorphic for complex logits (the shift cancels)."""
    shift = jax.lax.stop_gradient(jnp.max(jnp.real(logits_xK), axis=-1, keepdims=True))
    e = jnp.exp(logits_xK - shift)
    return e / jnp.sum(e, axis=-1, keepdims=True)


def relative_index(grid: tuple) -> np.ndarray:
    """[P, P] index of the periodic displacement from patch p to patch q on the patch grid."""
    coords = np.stack(np.unravel_index(np.arange(math.prod(grid)), grid), axis=-1)  # [P, d]
    delta = (coords[None, :, :] - coords[:, None, :]) % np.asarray(grid)
    return np.ravel_multi_index(tuple(np.moveaxis(delta, -1, 0)), grid).astype(np.int32)


class ViT(nn.Module):
    """Spins cut into patch_size^d-cell patches, each embedded linearly; n_layers encoder layers
    (multi-head self-attention with a learned bias per head and periodic patch displacement,
    then a two-layer log cosh feed-forward, both residual); the patches summed (invariant under
    translations by whole patches); log psi = sum_a log cosh(b_a + w_a . z) with complex w, b.
    Real dtypes keep the body real and hold w, b as real and imaginary parts; complex dtypes
    make every parameter complex (holomorphic). Full translation invariance: a `sector`.
    """

    patch_size: int = 2
    """Patch extent in cells along each lattice direction (must divide the lattice's extents)."""
    d_model: int = 8
    """Embedding width."""
    n_heads: int = 2
    """Attention heads (must divide d_model)."""
    n_layers: int = 1
    """Encoder layers."""
    sector: Any = None
    """The symmetry sector projected onto: None (no projection), a `runner.physics.symmetry.Sector`
    or {momentum, irrep, parity}; held as a `models.symmetrize.Projection`. log psi is invariant
    under translations by whole patches: one image per coset of them, and only momenta m with
    every m_a patch_size / L_a an integer."""
    param_dtype: Any = jnp.float64
    """Parameter dtype: real gives a real body and a complex output layer, complex makes all complex."""
    hilbert: Any = None
    """The lattice (given by the runner); held as a `models.symmetrize.Lattice`."""

    holomorphic = True  # with complex parameters log psi is holomorphic in them (not a field)

    def __post_init__(self):
        for key in ("patch_size", "d_model", "n_heads", "n_layers"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(key, f"must be a positive integer (got {value!r})")
        if self.d_model % self.n_heads:
            raise ConfigError("n_heads", f"must divide d_model={self.d_model} (got {self.n_heads})")
        check_param_dtype(self.param_dtype)
        lattice = symmetrize.lattice_of(self.hilbert)
        if any(e % self.patch_size for e in lattice.shape):
            extents = lattice.shape
            raise ConfigError("patch_size", f"must divide the lattice's extents {extents} (got {self.patch_size})")
        invariance = None
        if not isinstance(self.hilbert, symmetrize.Lattice):
            invariance = symmetrize.Invariance(
                symmetrize.translations_by(self.hilbert, self.patch_size), "translations by whole patches",
                "a patch_size p that makes every m_a p / L_a an integer (p = L reaches every momentum)")
        object.__setattr__(self, "sector", symmetrize.projection_of(self.sector, self.hilbert, invariance))
        object.__setattr__(self, "hilbert", lattice)
        super().__post_init__()

    def patches(self, sigma_xN):
        """Spins [..., N] -> patches [B, P, patch_size^d n_basis] (B the flattened batch)."""
        lattice, p = self.hilbert, self.patch_size
        grid = tuple(e // p for e in lattice.shape)
        split = [s for g in grid for s in (g, p)]
        x = sigma_xN.reshape(-1, *split, lattice.n_basis)
        d = len(grid)
        order = [0, *range(1, 2 * d, 2), *range(2, 2 * d + 1, 2), 2 * d + 1]  # grid axes, then in-patch
        return jnp.transpose(x, order).reshape(x.shape[0], math.prod(grid), -1), grid

    @nn.compact
    def unprojected(self, sigma_xN):
        """log psi before the symmetry projection [...] (complex)."""
        complex_params = jnp.issubdtype(self.param_dtype, jnp.complexfloating)
        body = self.param_dtype
        patches_BxPxD, grid = self.patches(sigma_xN)
        rel_PxP = relative_index(grid)
        heads, width = self.n_heads, self.d_model // self.n_heads
        # Residual branches start at 1 / sqrt(2 n_layers) of unit gain (2 n_layers of them add up
        # in x): at unit gain the spread of log|psi| over random configurations grew with depth
        # past any Markov chain's reach (d_model 64: std 0.6 with 2 layers, 12 with 4, 261 with 8).
        branch_gain = 1.0 / math.sqrt(2 * self.n_layers)
        x = _dense(self.d_model, body, "embed")(patches_BxPxD.astype(body))
        for layer in range(self.n_layers):
            q, k, v = (_dense(self.d_model, body, f"{n}{layer}")(x).reshape(*x.shape[:-1], heads, width)
                       for n in "qkv")
            bias_HxP = self.param(f"position_bias{layer}", normal(0.01), (heads, len(rel_PxP)), body)
            logits = jnp.einsum("bphw,bqhw->bhpq", q, k) / math.sqrt(width) + bias_HxP[:, rel_PxP]
            attended = jnp.einsum("bhpq,bqhw->bphw", softmax(logits), v).reshape(x.shape)
            x = x + _dense(self.d_model, body, f"out{layer}", branch_gain)(attended)
            hidden = log_cosh(_dense(2 * self.d_model, body, f"ff_in{layer}")(x))
            x = x + _dense(self.d_model, body, f"ff_out{layer}", branch_gain)(hidden)
        z_BxD = jnp.sum(x, axis=-2)
        # Small output weights: log psi nearly flat at the start (samples spread out).
        gain = 0.1 / math.sqrt(len(rel_PxP))  # z is a sum over the P patches
        if complex_params:
            theta = _dense(self.d_model, body, "output", gain)(z_BxD)
        else:
            re = _dense(self.d_model, body, "output_real", gain)(z_BxD)
            im = _dense(self.d_model, body, "output_imag", gain)(z_BxD)
            theta = jax.lax.complex(re, im)
        return sum_log_cosh(theta).reshape(sigma_xN.shape[:-1])

    def __call__(self, sigma_xN):
        return symmetrize.project(self.unprojected, sigma_xN, self.sector)
