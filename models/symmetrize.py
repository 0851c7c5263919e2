"""Symmetry projection of any log psi: the lattice the models read, images and their characters."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from runner.errors import ConfigError

SYMMETRIES = ("none", "translations", "point", "lattice")
PARITIES = (None, 1, -1)


@dataclasses.dataclass(frozen=True)
class Lattice:
    """What the models read from the runner's `runner.physics.hilbert.Hilbert`, as hashable tuples.

    Attributes:
        n_sites: N.
        shape: unit cells per direction, (L,) or (Lx, Ly); site index (x Ly + y) n_basis + b.
        n_basis: sites per unit cell.
        pbc: periodic boundaries.
        translations: T rows of N site indices, row t: site i -> its image (row 0 identity).
        space_group: G rows of N site indices, the lattice's space group (point group and
            translations, see `runner.physics.hilbert.Hilbert.space_group`): row 0 the identity, rows
            0..T-1 the translations; () when the lattice does not give one (the identity alone).
    """

    n_sites: int
    shape: tuple
    n_basis: int
    pbc: bool
    translations: tuple
    space_group: tuple = ()

    @property
    def translations_TxN(self) -> np.ndarray:
        return np.asarray(self.translations, np.int32).reshape(-1, self.n_sites)

    @property
    def space_group_GxN(self) -> np.ndarray:
        """[G, N] the space group's rows (the identity alone when the lattice gives none)."""
        if not self.space_group:
            return np.arange(self.n_sites, dtype=np.int32)[None]
        return np.asarray(self.space_group, np.int32).reshape(-1, self.n_sites)

    @property
    def point_group_PxN(self) -> np.ndarray:
        """[P, N] one space-group row per coset of the translations (the point operations, each
        followed by some translation), in the space group's order: row 0 the identity. For a log
        psi already invariant under the translations, the sum over these rows is the sum over
        the whole space group divided by T."""
        translations_TxN = self.translations_TxN
        rows, seen = [], set()
        for row in self.space_group_GxN:
            coset = min(tuple(t[row].tolist()) for t in translations_TxN)  # the same for t' o row
            if coset not in seen:
                seen.add(coset)
                rows.append(row)
        return np.asarray(rows, np.int32)

    def displacement(self, t: int) -> tuple:
        """The cell offset (one integer per direction) of translation t."""
        return tuple(int(c) for c in np.unravel_index(self.translations[t][0] // self.n_basis, self.shape))


def lattice_of(hilbert) -> Lattice:
    """The runner's lattice as a `Lattice` (idempotent: models re-run this when flax clones them)."""
    if isinstance(hilbert, Lattice):
        return hilbert
    if hilbert is None:
        raise ConfigError("hilbert", "is required: this model is built on the lattice (the runner passes it)")
    shape = tuple(int(e) for e in hilbert.shape)
    cells = math.prod(shape)
    if hilbert.n_sites % cells:
        raise ConfigError("hilbert", f"has {hilbert.n_sites} sites, not a whole number per cell of {shape}")
    translations = tuple(tuple(int(i) for i in row) for row in np.asarray(hilbert.translations))
    group = getattr(hilbert, "space_group", None)
    space_group = () if group is None else tuple(tuple(int(i) for i in row) for row in np.asarray(group))
    return Lattice(int(hilbert.n_sites), shape, hilbert.n_sites // cells, bool(hilbert.pbc), translations,
                   space_group)


def check_keys(symmetries, parity, momentum, lattice: Lattice, translation_invariant: bool = False):
    """Refuses an unknown symmetry group, parity, or a momentum that does not fit the lattice;
    `point` only for a model whose log psi is invariant under the translations already (on any
    other it would sum over coset representatives: a state of no symmetry)."""
    if symmetries not in SYMMETRIES:
        raise ConfigError("symmetries", f"must be one of {', '.join(SYMMETRIES)} (got {symmetries!r})")
    if symmetries == "point" and not translation_invariant:
        raise ConfigError("symmetries", "point needs a model invariant under the lattice's translations "
                          "(rbm_symm, or cnn on a periodic lattice); use lattice")
    if isinstance(parity, bool) or parity not in PARITIES:
        raise ConfigError("parity", f"must be null, 1 or -1 (got {parity!r})")
    if momentum is None:
        return None
    d = len(lattice.shape)
    if (not isinstance(momentum, (list, tuple)) or len(momentum) != d
            or any(isinstance(m, bool) or not isinstance(m, int) for m in momentum)):
        raise ConfigError("momentum", f"must be null or a list of {d} integers m, q = m_k / L_k b_k (got {momentum!r})")
    if symmetries != "translations":
        # With the point group a momentum q != 0 is no longer a one-dimensional character (the
        # rotations mix q with its star); symmetries=lattice projects onto the trivial one.
        raise ConfigError("momentum", f"needs symmetries=translations (got symmetries={symmetries})")
    return tuple(momentum)


def images(lattice: Lattice, symmetries: str, parity, momentum):
    """The symmetry images of a configuration and their characters.

    Returns:
        (perm_GxN int32: image g of sigma is sign_G[g] * sigma[perm_GxN[g]],
         sign_G int8 (+1, or -1 for the spin-flipped half),
         weight_G complex128: psi_P(s) = sum_g weight_g psi(image_g(s)).)
    Translations with momentum q weigh image t by exp(-i q . d_t), so psi_P(T_u s) =
    exp(i q . d_u) psi_P(s); `lattice` takes every space-group element with weight 1 (the
    trivial representation A1: psi_P(g s) = psi_P(s)); the spin flip weighs by `parity`.
    """
    perms = {"translations": lattice.translations_TxN, "point": lattice.point_group_PxN,
             "lattice": lattice.space_group_GxN}.get(
        symmetries, np.arange(lattice.n_sites, dtype=np.int32)[None])
    weights = np.ones(len(perms), np.complex128)
    if momentum is not None:
        for t in range(len(perms)):
            phase = sum(m * d / e for m, d, e in zip(momentum, lattice.displacement(t), lattice.shape))
            weights[t] = np.exp(-2j * np.pi * phase)
    signs = np.ones(len(perms), np.int8)
    if parity is not None:
        perms = np.concatenate([perms, perms])
        signs = np.concatenate([signs, -signs])
        weights = np.concatenate([weights, parity * weights])
    return perms.astype(np.int32), signs, weights


def project(log_psi_fn, sigma_xN, lattice: Lattice, symmetries: str, parity, momentum):
    """log psi_P(s) = log sum_g weight_g exp(log psi(image_g(s))) [...], computed stably.

    The largest real part is taken out before exponentiating (as a constant: it cancels),
    so complex log psi and any weights are fine. The result is real only when log psi is
    real and every weight is a positive real.
    """
    if symmetries == "none" and parity is None:
        return log_psi_fn(sigma_xN)
    perm_GxN, sign_G, weight_G = images(lattice, symmetries, parity, momentum)
    images_xGxN = sigma_xN[..., perm_GxN] * jnp.asarray(sign_G, sigma_xN.dtype)[:, None]
    return log_weighted_sum(log_psi_fn(images_xGxN), weight_G)


def log_weighted_sum(log_psi_xG, weight_G):
    """log sum_g weight_g exp(log_psi_xG[..., g]) [...], the largest real part taken out before
    exponentiating (as a constant: it cancels). Real when log psi is real and every weight
    (a NumPy array [G]) a positive real; complex otherwise."""
    shift_x = jax.lax.stop_gradient(jnp.max(jnp.real(log_psi_xG), axis=-1, keepdims=True))
    positive = np.allclose(weight_G.imag, 0) and np.all(weight_G.real > 0)
    if positive and not jnp.iscomplexobj(log_psi_xG):
        w_G = jnp.asarray(weight_G.real, log_psi_xG.dtype)
        return jnp.log(jnp.sum(w_G * jnp.exp(log_psi_xG - shift_x), axis=-1)) + shift_x[..., 0]
    dtype = jnp.result_type(log_psi_xG.dtype, jnp.complex64)
    w_G = jnp.asarray(weight_G, dtype)
    total = jnp.sum(w_G * jnp.exp((log_psi_xG - shift_x).astype(dtype)), axis=-1)
    return jnp.log(total) + shift_x[..., 0]
