"""Symmetric restricted Boltzmann machine: hidden units shared over a lattice symmetry group."""

from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from models import symmetrize
from models.common import attached, check_param_dtype, normal
from models.fast_paths import LocalRatios, SamplerCache
from models.rbm import RBM
from runner.errors import ConfigError

# The groups of the lattice's space group by their one name (`runner.physics.space_group.SUBGROUPS`),
# and the sector's kernel.
GROUPS = ("translations", "lattice", "sector")


def _invariance(hilbert, group: str, sector) -> symmetrize.Invariance | None:
    """The group log psi is invariant under (None before the Hilbert space is given or once it
    is held as a Lattice: the sector is resolved then)."""
    if hilbert is None or isinstance(hilbert, symmetrize.Lattice):
        return None
    if group == "translations":
        return symmetrize.Invariance(symmetrize.translations_by(hilbert, 1), "the translations",
                                     "model=vit with a patch_size p that makes every m_a p / L_a an integer")
    if group == "sector":
        if sector is None:
            raise ConfigError("group", "sector shares the weights over the elements on which model.sector's "
                                       "characters are 1, and needs model.sector (or auto)")
        if isinstance(sector, str):
            return None  # not a sector: `projection_of` says why
        return symmetrize.Invariance(symmetrize.kernel_of(sector, hilbert), "the sector's kernel", "")
    return symmetrize.Invariance(symmetrize.lattice_of(hilbert).group.rows("lattice"), "the space group",
                                 "group=translations for another irrep at k = 0, or model=vit")


class RBMSymm(nn.Module):
    """log psi(s) = a sum_i s_i + sum_{f, g} log cosh(b_f + sum_i W_fi s_{g(i)}): each of the
    `alpha` features has one weight vector and bias, shared by its hidden units over the G
    elements g of `group`, so log psi is invariant under that group.

    It is an RBM whose N x (G alpha) weight matrix is W with its rows permuted by each group
    element: the RBM's local updates (sampler cache, local-energy ratios) apply to that matrix
    unchanged, so this model runs on them whenever its sector asks for no projection on top.
    """

    alpha: int = 1
    """Features: the number of hidden units is alpha * G (G elements of `group`)."""
    group: str = "translations"
    """The group the hidden units are shared over: translations (the lattice's T translations),
    lattice (its space group: translations with the rotations and reflections that map the
    finite lattice onto itself) or sector (the elements on which `sector`'s characters are 1:
    every sector, k != 0 included, with the most sharing that reaches it)."""
    sector: Any = None
    """The symmetry sector projected onto: None (no projection), a `runner.physics.symmetry.Sector`
    or {momentum, irrep, parity}; held as a `models.symmetrize.Projection`. log psi is invariant
    under `group` already: one image per coset of it, and only sectors trivial on it."""
    param_dtype: Any = jnp.float64
    """Parameter dtype; complex dtypes give a complex (holomorphic) wavefunction."""
    hilbert: Any = None
    """The lattice (given by the runner); held as a `models.symmetrize.Lattice`."""

    holomorphic = True  # log psi is holomorphic in complex parameters (not a field)
    # The RBM's local updates on the expanded weight matrix (`local_tables`); the Jacobian
    # products are left to autodiff (a few parameters per feature: SR's dense solvers).
    fast_paths = (LocalRatios, SamplerCache)

    def __post_init__(self):
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, int) or self.alpha < 1:
            raise ConfigError("alpha", f"must be a positive integer (got {self.alpha!r})")
        if self.group not in GROUPS:
            raise ConfigError("group", f"must be one of {', '.join(GROUPS)} (got {self.group!r})")
        check_param_dtype(self.param_dtype)
        object.__setattr__(self, "sector", symmetrize.projection_of(self.sector, self.hilbert, _invariance(self.hilbert, self.group, self.sector)))
        object.__setattr__(self, "hilbert", symmetrize.lattice_of(self.hilbert))
        super().__post_init__()

    def fast_paths_apply(self) -> tuple:
        """All of them without projection; with one, the local ratios (of the projection, from
        those of `unprojected`), the sampler taking plain evaluations."""
        return (LocalRatios,) if symmetrize.projects(self.sector) else self.fast_paths

    def group_GxN(self) -> np.ndarray:
        """The group's permutations: image g of s is s[perm[g]] (row 0 the identity)."""
        if self.group == "sector":
            return np.asarray(self.sector.invariant, np.int32)
        return self.hilbert.group.rows(self.group)  # translations or lattice

    def plus_x(self, params):
        """The parameters of the uniform state from those of an initialisation: feature f sees site
        f mod N alone (`models.common.attached`), every bias zero; its images theta_gf = s_g(f) keep
        psi uniform, and the log-derivatives in W, tanh(1) sum_g s_g(f) s_g(k), hold every
        symmetric two-body term."""
        return {"kernel": attached(params["kernel"]), "hidden_bias": jnp.zeros_like(params["hidden_bias"]),
                "visible_bias": jnp.zeros_like(params["visible_bias"])}

    @nn.compact
    def unprojected(self, sigma_xN):
        """log psi before the symmetry projection [...]."""
        n = sigma_xN.shape[-1]
        params = {
            "kernel": self.param("kernel", normal(0.1 / n**0.5), (n, self.alpha), self.param_dtype),
            "hidden_bias": self.param("hidden_bias", normal(0.01), (self.alpha,), self.param_dtype),
            "visible_bias": self.param("visible_bias", normal(0.01), (), self.param_dtype),
        }
        return RBM.local_log_psi(self.local_state(self.local_tables(params), sigma_xN))

    def __call__(self, sigma_xN):
        return symmetrize.project(self.unprojected, sigma_xN, self.sector)

    # --- the RBM's fast paths, on the expanded parameters ------------------------------------

    def local_tables(self, params):
        """The RBM tables of the equivalent RBM: kernel [N, G alpha] with column (g, f) =
        W_f permuted by g (theta_gf = sum_i W_fi s_{g(i)} = sum_j s_j W_{f, g^-1(j)}), the hidden
        bias repeated over g, the visible bias on every site."""
        perm_GxN = self.group_GxN()
        inverse_GxN = np.argsort(perm_GxN, axis=1)
        kernel_NxF = params["kernel"]
        n, n_features = kernel_NxF.shape
        kernel_NxM = jnp.swapaxes(kernel_NxF[inverse_GxN], 0, 1).reshape(n, -1)  # [N, G, F] -> [N, G F]
        expanded = {
            "kernel": kernel_NxM,
            "hidden_bias": jnp.tile(params["hidden_bias"], len(perm_GxN)),
            "visible_bias": jnp.full((n,), params["visible_bias"]),
        }
        return RBM.local_tables(expanded)

    local_state = staticmethod(RBM.local_state)
    local_ratios = staticmethod(RBM.local_ratios)
    sampler_init = staticmethod(RBM.sampler_init)
    sampler_update = staticmethod(RBM.sampler_update)
