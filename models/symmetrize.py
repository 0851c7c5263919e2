"""Symmetry projection of any log psi onto a sector: the lattice the models read, the images of a
configuration and their characters."""

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from runner.errors import ConfigError
from runner.physics import symmetry
from runner.physics.space_group import SpaceGroup


@dataclasses.dataclass(frozen=True)
class Lattice:
    """What the models read from the runner's `runner.physics.hilbert.Hilbert`, as hashable values.

    Attributes:
        n_sites: N.
        shape: unit cells per direction, (L,) or (Lx, Ly); site index (x Ly + y) n_basis + b.
        n_basis: sites per unit cell.
        pbc: periodic boundaries.
        group: the space group the Hilbert space carries (`runner.physics.space_group.SpaceGroup`,
            a hashable value); the identity alone when it carries none.
    """

    n_sites: int
    shape: tuple
    n_basis: int
    pbc: bool
    group: SpaceGroup

    @property
    def translations_TxN(self) -> np.ndarray:
        """[T, N] the translations (row 0 the identity), `group.rows("translations")`."""
        return self.group.rows("translations")

    @property
    def space_group_GxN(self) -> np.ndarray:
        """[G, N] the space group's distinct rows, `group.rows("lattice")` (row 0 the identity,
        rows 0..T-1 the translations)."""
        return self.group.rows("lattice")


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
    return Lattice(int(hilbert.n_sites), shape, hilbert.n_sites // cells, bool(hilbert.pbc),
                   symmetry.space_group(hilbert))


class Invariance(NamedTuple):
    """A symmetry a model's log psi has without projection.

    Attributes:
        rows_HxN: the group's site permutations (psi(s[row]) = psi(s) for each row).
        name: the group in words, e.g. "the translations".
        alternative: what reaches the sectors this invariance rules out, e.g. "model=vit".
    """

    rows_HxN: np.ndarray
    name: str
    alternative: str


@dataclasses.dataclass(frozen=True)
class Projection:
    """A model's symmetry sector and the images its log psi is summed over, as hashable tuples.

    psi_P(s) = sum_g weights[g] psi(signs[g] s[perms[g]]) is sum_{g in G_k} chi(g)* psi(g s)
    (`runner.physics.symmetry`), with the elements that give the model the same value (by its own
    invariance, or by moving the sites alike) taken together: one image per class, weighed by the
    class's summed chi* over the identity class's; with parity, every image once more spin-flipped
    and weighed by parity.

    Attributes:
        sector: the `runner.physics.symmetry.Sector` projected onto.
        perms: rows of N site indices, the identity first.
        signs: +1, or -1 for the spin-flipped half.
        weights: complex weights, 1 on the identity.
        invariant: rows of N site indices, the group the model's log psi is invariant under
            (the identity first), as the model declared it; () for none.
    """

    sector: Any
    perms: tuple
    signs: tuple
    weights: tuple
    invariant: tuple = ()

    @property
    def trivial(self) -> bool:
        """The identity alone: psi_P = psi (the model evaluated without projection)."""
        return len(self.perms) == 1

    def arrays(self):
        """(perm_GxN int32, sign_G int8, weight_G complex128)."""
        return (np.asarray(self.perms, np.int32), np.asarray(self.signs, np.int8),
                np.asarray(self.weights, np.complex128))


def translations_by(hilbert, step: int) -> np.ndarray:
    """[T', N] the lattice's translations by a multiple of `step` cells in every direction."""
    group = symmetry.space_group(hilbert)
    translation = group.op_E == 0
    return group.perm_ExN[translation & np.all(group.shift_ExD % step == 0, axis=-1)]


def _class_labels(rows_ExN, invariant_HxN) -> list:
    """A label per row, equal for rows r, r' with psi(s[r]) = psi(s[r']) for every s by the
    invariance (r' = r o h): the lexicographically smallest row of r o H (H itself for r in H)."""
    group = {tuple(h) for h in invariant_HxN.tolist()}
    labels = []
    for row in rows_ExN:
        if tuple(row.tolist()) in group:
            labels.append("H")
            continue
        moved_HxN = row[invariant_HxN]
        labels.append(tuple(moved_HxN[np.lexsort(moved_HxN.T[::-1])[0]].tolist()))
    return labels


def _check_reach(sector, rows_ExN, chi_E, invariance: Invariance | None):
    """Refuses a sector that holds no state of the lattice (an element that moves no site with
    chi != 1), or one the model's invariance makes vanish (chi != 1 on that group)."""
    off = np.abs(chi_E - 1) > 1e-9
    fixed = np.all(rows_ExN == np.arange(rows_ExN.shape[1]), axis=1)
    if np.any(off & fixed):
        raise ConfigError("sector", f"{sector.name} holds no state of this lattice (an element of its little group "
                                    f"moves no site but has a character other than 1)")
    if invariance is None:
        return
    group = {tuple(h) for h in invariance.rows_HxN.tolist()}
    inside = np.array([tuple(r) in group for r in rows_ExN.tolist()])
    if np.any(off & inside):
        raise ConfigError("sector", f"{sector.name} is out of this model's reach: its log psi is invariant under "
                                    f"{invariance.name}, on which the sector's characters are not all 1, so its "
                                    f"projection vanishes; use {invariance.alternative}")


def projection_of(sector, hilbert, invariance: Invariance | None = None) -> Projection | None:
    """A model's `sector` as the images its projection sums over (idempotent: flax re-runs it).

    Args:
        sector: None (no projection), a `runner.physics.symmetry.Sector`, {momentum, irrep,
            parity} (`symmetry.parse_sector`), or a `Projection` (returned as it is).
        hilbert: the runner's `runner.physics.hilbert.Hilbert`.
        invariance: the symmetry the model has already: its elements collapse into one image,
            and a sector whose characters are not 1 on it is refused.

    Raises:
        ConfigError (key `sector`, or `sector.KEY`): a value that is no sector of the lattice or
        its Sz space, `auto` (resolved by the runner, which knows the Hamiltonian), or a sector
        the model cannot reach.
    """
    if sector is None or isinstance(sector, Projection):
        return sector
    if isinstance(sector, str) and sector == "auto":
        raise ConfigError("sector", "auto is resolved by the runner from the Hamiltonian (runner.config.build); "
                                    "a model built by hand takes null or {momentum: [...], irrep: A1, parity: 1}")
    if hilbert is None or isinstance(hilbert, Lattice):
        raise ConfigError("hilbert", "is required as the runner's Hilbert space to resolve a sector")
    group = symmetry.space_group(hilbert)
    if not isinstance(sector, symmetry.Sector):
        sector = symmetry.parse_sector(sector, hilbert, "sector", group)
    try:
        symmetry.check_fits(hilbert, sector)
        elements, chi_E = symmetry.characters(group, sector)
    except ValueError as err:
        raise ConfigError("sector", str(err)) from None
    rows_ExN = group.perm_ExN[elements]
    _check_reach(sector, rows_ExN, chi_E, invariance)
    identity = np.arange(hilbert.n_sites, dtype=np.int32)[None]
    labels = _class_labels(rows_ExN, identity if invariance is None else invariance.rows_HxN)
    firsts = {}
    for e, label in enumerate(labels):
        firsts.setdefault(label, e)
    totals = {label: 0j for label in firsts}
    for label, c in zip(labels, chi_E):
        totals[label] += np.conj(c)
    perms = [tuple(int(i) for i in rows_ExN[e]) for e in firsts.values()]
    weights = [complex(totals[label] / totals[labels[0]]) for label in firsts]
    signs = [1] * len(perms)
    if sector.parity is not None:
        perms, signs, weights = perms * 2, signs + [-1] * len(signs), weights + [sector.parity * w for w in weights]
    invariant = () if invariance is None else tuple(tuple(int(i) for i in row) for row in invariance.rows_HxN)
    return Projection(sector, tuple(perms), tuple(signs), tuple(weights), invariant)


def kernel_of(sector, hilbert) -> np.ndarray:
    """[H, N] the elements of the sector's little group on which its character is 1 (identity
    first): a group every state of the sector is invariant under, the largest a model may share
    its weights over and still reach the sector.

    Args:
        sector: a `runner.physics.symmetry.Sector` or {momentum, irrep, parity}.
        hilbert: the runner's `runner.physics.hilbert.Hilbert`.

    Raises:
        ConfigError (key `sector`, or `sector.KEY`): a value that is no sector of the lattice.
    """
    group = symmetry.space_group(hilbert)
    if not isinstance(sector, symmetry.Sector):
        sector = symmetry.parse_sector(sector, hilbert, "sector", group)
    try:
        elements, chi_E = symmetry.characters(group, sector)
    except ValueError as err:
        raise ConfigError("sector", str(err)) from None
    return group.perm_ExN[elements[np.abs(chi_E - 1) < 1e-9]].astype(np.int32)


def projects(projection: Projection | None) -> bool:
    """Whether a model's `sector` sums over more than the identity (None: no projection)."""
    return projection is not None and not projection.trivial


def project(log_psi_fn, sigma_xN, projection: Projection | None):
    """log psi_P(s) = log sum_g weight_g exp(log psi(image_g(s))) [...], computed stably.

    Without projection (None, or the identity alone) this is log_psi_fn(sigma_xN) itself. The
    largest real part is taken out before exponentiating (as a constant: it cancels), so complex
    log psi and any weights are fine. The result is real only when log psi is real and every
    weight is a positive real.
    """
    if not projects(projection):
        return log_psi_fn(sigma_xN)
    perm_GxN, sign_G, weight_G = projection.arrays()
    images_xGxN = sigma_xN[..., perm_GxN] * jnp.asarray(sign_G, sigma_xN.dtype)[:, None]
    return log_weighted_sum(log_psi_fn(images_xGxN), weight_G)


def log_weighted_sum(log_psi_xG, weight_G):
    """log sum_g weight_g exp(log_psi_xG[..., g]) [...], the largest real part taken out before
    exponentiating (as a constant: it cancels). Real when log psi is real and every weight
    (a NumPy array [G]) a positive real; complex otherwise."""
    shift_x = jax.lax.stop_gradient(jnp.max(jnp.real(log_psi_xG), axis=-1, keepdims=True))
    w_G = _weights_for(weight_G, log_psi_xG)
    total = jnp.sum(w_G * jnp.exp((log_psi_xG - shift_x).astype(w_G.dtype)), axis=-1)
    return jnp.log(total) + shift_x[..., 0]


def _weights_for(weight_G, *values):
    """The weights [G] as a jax array in the dtype of a weighted sum of `values`: real (theirs)
    when every weight is a positive real and every value real, else complex."""
    dtype = jnp.result_type(*(v.dtype for v in values))
    positive = np.allclose(weight_G.imag, 0) and np.all(weight_G.real > 0)
    if positive and not jnp.issubdtype(dtype, jnp.complexfloating):
        return jnp.asarray(weight_G.real, dtype)
    return jnp.asarray(weight_G, jnp.result_type(dtype, jnp.complex64))


def projected_ratio(ratio, log_psi, projection: Projection):
    """The local ratios of a projection, psi_P(s'_k) / psi_P(s), from those of the model it projects.

    psi_P(s') / psi_P(s) = sum_g c_g r_g with c_g = weight_g psi(g s) / psi_P(s) and r_g =
    psi(g s') / psi(g s): each image g s' is a move of g s, on the sites the image puts the moved
    spins at (the inverse permutation), its change signed like the image. The model's own ratios
    give each r_g at the cost of a move; the images g s are evaluated once per configuration.

    Args:
        ratio: (params, sigma_N, sites_KxJ, delta_KxJ) -> psi(s'_k) / psi(s) [K] of the model.
        log_psi: (params, sigma_xN) -> log psi [...] of the model before the projection.
        projection: the (nontrivial) projection.

    Returns:
        The same function for psi_P. Real when the model's values are real and every weight is a
        positive real (as `log_weighted_sum`); complex otherwise.
    """
    perm_GxN, sign_G, weight_G = projection.arrays()
    inverse_GxN = np.argsort(perm_GxN, axis=1).astype(np.int32)

    def ratio_P(params, sigma_N, sites_KxJ, delta_KxJ):
        images_GxN = sigma_N[perm_GxN] * jnp.asarray(sign_G, sigma_N.dtype)[:, None]
        log_psi_G = log_psi(params, images_GxN)
        sites_GxKxJ = jnp.asarray(inverse_GxN)[:, sites_KxJ]
        delta_GxKxJ = delta_KxJ[None] * jnp.asarray(sign_G, delta_KxJ.dtype)[:, None, None]
        r_GxK = jax.vmap(ratio, in_axes=(None, 0, 0, 0))(params, images_GxN, sites_GxKxJ, delta_GxKxJ)
        shift = jax.lax.stop_gradient(jnp.max(jnp.real(log_psi_G)))
        c_G = _weights_for(weight_G, log_psi_G, r_GxK) * jnp.exp(log_psi_G - shift)
        return jnp.sum(c_G[:, None] * r_GxK, axis=0) / jnp.sum(c_G)

    return ratio_P
