"""Spin-1/2 Hilbert spaces on lattices: sites, bonds, sublattices and the Sz sector."""

import math
from typing import NamedTuple

import numpy as np

from runner.errors import ConfigError, require_bool, require_int
from runner.physics import lattice
from runner.physics import space_group as groups
from runner.physics.space_group import SpaceGroup


class Hilbert(NamedTuple):
    """A lattice of spin-1/2 sites. Spins are stored as +1 (up) / -1 (down).

    Attributes:
        n_sites: number of sites N.
        bonds: int32 [B, 2], the first distance shell of the infinite lattice (i < j, sorted).
        next_bonds: int32 [B2, 2], the second distance shell (i < j, sorted).
        sublattice: int32 [N] with 0/1 for a bipartite bond graph, or None.
        total_sz: None (no constraint) or the total S^z in units of hbar (sum of s_i/2).
        shape: unit cells per direction, (L,) or (Lx, Ly); (N,) for a graph.
        pbc: periodic boundaries.
        positions: float [N, d], site coordinates.
        translations: int32 [T, N], row t maps site i to the site it moves to under
            lattice translation t (all Lx * Ly translations of the torus with pbc, the
            identity only without; row 0 is the identity).
        momenta: float [M, d], the wave vectors q = m1/Lx b1 + m2/Ly b2 of the torus
            (b the reciprocal vectors, b_i . a_j = 2 pi delta_ij), also for open boundaries.
        next_bonds_issue: why `next_bonds` cannot carry a coupling on this (too small
            periodic) lattice, or None.
        space_group: the lattice's `space_group.SpaceGroup`, found once from the geometry when the
            space is built (chain: the reflection; square: C4v; triangular, honeycomb, kagome: C6v,
            about the point group's centre, each composed with every translation, as far as the
            finite lattice keeps them); the identity alone for a graph or copies. Every consumer
            reads it (`rows(name)` for none, translations, lattice).
        copies: the sites are this many copies of one space side by side (N / copies sites each,
            `physics.replicas`), `total_sz` fixed in each copy; 1 for an ordinary space.
        three_sublattice: int32 [N] with 0/1/2, the sublattices of the 120-degree pattern of a
            triangular lattice (periodic extents multiples of 3, or open), or None.
    """

    n_sites: int
    bonds: np.ndarray
    next_bonds: np.ndarray
    sublattice: np.ndarray | None
    total_sz: float | None
    shape: tuple
    pbc: bool
    positions: np.ndarray
    translations: np.ndarray
    momenta: np.ndarray
    next_bonds_issue: str | None = None
    space_group: SpaceGroup | None = None
    copies: int = 1
    three_sublattice: np.ndarray | None = None

    @property
    def n_up(self) -> int | None:
        """Number of up spins fixed by `total_sz` (in each copy), or None."""
        if self.total_sz is None:
            return None
        return int(round(self.n_sites // self.copies / 2 + self.total_sz))

    @property
    def n_states(self) -> int:
        """Dimension of the (constrained) Hilbert space."""
        if self.total_sz is None:
            return 2**self.n_sites
        return math.comb(self.n_sites // self.copies, self.n_up) ** self.copies


def _check_total_sz(n_sites, total_sz):
    if total_sz is None:
        return None
    if isinstance(total_sz, bool) or not isinstance(total_sz, (int, float)):
        raise ConfigError("total_sz", f"must be null or a number (got {total_sz!r})")
    n_up = n_sites / 2 + total_sz
    if abs(n_up - round(n_up)) > 1e-9 or not 0 <= n_up <= n_sites:
        allowed = ", ".join(str(k - n_sites / 2) for k in range(n_sites + 1))
        raise ConfigError(
            "total_sz",
            f"{total_sz} is impossible for {n_sites} spins; allowed values are null or {allowed}",
        )
    return float(total_sz)


def _on_lattice(kind, extents, pbc, total_sz, size_keys) -> Hilbert:
    """Spins on the sites of `lattice.build(kind, extents, pbc, size_keys)`."""
    sites = lattice.build(kind, extents, pbc, size_keys)
    group = groups.of_lattice(kind, sites.positions, sites.translations, tuple(extents), pbc)
    return Hilbert(total_sz=_check_total_sz(sites.n_sites, total_sz), shape=tuple(extents), pbc=pbc,
                   space_group=group, **sites._asdict())


def chain(L: int, pbc: bool = True, total_sz: float | None = None) -> Hilbert:
    """A chain of L spins, a1 = (1,); next-nearest neighbours are at distance 2.

    Args:
        L: number of sites (at least 2, at least 3 with pbc).
        pbc: periodic boundaries. On small rings a pair joined through several periodic
            images is one bond (L = 4: next_bonds (0, 2), (1, 3)); on L = 3 next_bonds
            repeat bonds, so Hamiltonians refuse a nonzero coupling on them.
        total_sz: null, or the fixed total S^z (0 = zero magnetisation).
    """
    require_int("L", L, minimum=2)
    require_bool("pbc", pbc)
    if pbc and L < 3:
        raise ConfigError("L", f"must be at least 3 with pbc=true (got {L})")
    return _on_lattice("chain", (L,), pbc, total_sz, ("L",))


def _planar(kind, L, Lx, Ly, *, pbc, total_sz):
    Lx = L if Lx is None else Lx
    Ly = L if Ly is None else Ly
    if Lx is None or Ly is None:
        raise ConfigError("L", "must be set (or both Lx and Ly)")
    keys = ("L" if L is not None and Lx is L else "Lx", "L" if L is not None and Ly is L else "Ly")
    require_int(keys[0], Lx, minimum=1)
    require_int(keys[1], Ly, minimum=1)
    require_bool("pbc", pbc)
    return _on_lattice(kind, (Lx, Ly), pbc, total_sz, keys)


_PLANAR_DOC = """An Lx x Ly {kind} lattice (Lx = Ly = L unless given), {geometry}.

    Site index (x * Ly + y) * n_basis + b. bonds / next_bonds are the first / second distance
    shells with periodic images included; a pair joined through several images within one
    shell is one bond. A site that would be its own nearest neighbour through the boundary
    is refused; where a site is its own second neighbour or a pair lies in both shells,
    `next_bonds_issue` says so and Hamiltonians refuse a nonzero coupling on next_bonds.

    Args:
        L: unit cells per direction (or Lx and Ly).
        Lx: unit cells along a1.
        Ly: unit cells along a2.
        pbc: periodic boundaries (a torus).
        total_sz: null, or the fixed total S^z.
    """


def square(L=None, Lx=None, Ly=None, pbc: bool = True, total_sz: float | None = None) -> Hilbert:
    return _planar("square", L, Lx, Ly, pbc=pbc, total_sz=total_sz)


def triangular(L=None, Lx=None, Ly=None, pbc: bool = True, total_sz: float | None = None) -> Hilbert:
    return _planar("triangular", L, Lx, Ly, pbc=pbc, total_sz=total_sz)


def honeycomb(L=None, Lx=None, Ly=None, pbc: bool = True, total_sz: float | None = None) -> Hilbert:
    return _planar("honeycomb", L, Lx, Ly, pbc=pbc, total_sz=total_sz)


def kagome(L=None, Lx=None, Ly=None, pbc: bool = True, total_sz: float | None = None) -> Hilbert:
    return _planar("kagome", L, Lx, Ly, pbc=pbc, total_sz=total_sz)


square.__doc__ = _PLANAR_DOC.format(kind="square", geometry="a1 = (1, 0), a2 = (0, 1); 4 and 4 neighbours")
triangular.__doc__ = _PLANAR_DOC.format(
    kind="triangular", geometry="a1 = (1, 0), a2 = (1/2, sqrt3/2); 6 and 6 neighbours"
)
honeycomb.__doc__ = _PLANAR_DOC.format(
    kind="honeycomb", geometry="triangular vectors, basis A = 0, B = (a1 + a2)/3; 3 and 6 neighbours"
)
kagome.__doc__ = _PLANAR_DOC.format(
    kind="kagome", geometry="triangular vectors, basis A = 0, B = a1/2, C = a2/2; 4 and 4 neighbours"
)


def _pairs(key, value, n_sites):
    if not isinstance(value, (list, tuple)):
        raise ConfigError(key, f"must be a list of [i, j] site pairs (got {value!r})")
    out = []
    for pair in value:
        if (not isinstance(pair, (list, tuple)) or len(pair) != 2
                or not all(isinstance(s, int) and not isinstance(s, bool) for s in pair)):
            raise ConfigError(key, f"must be a list of [i, j] site pairs (got {pair!r})")
        i, j = pair
        if not (0 <= i < n_sites and 0 <= j < n_sites) or i == j:
            raise ConfigError(key, f"pair {list(pair)} must join two different sites in 0..{n_sites - 1}")
        out.append((i, j))
    return out


def graph(
    n_sites: int,
    edges: list,
    next_edges: list | None = None,
    positions: list | None = None,
    pbc: bool = True,
    total_sz: float | None = None,
) -> Hilbert:
    """Spins on the sites of an arbitrary graph.

    Args:
        n_sites: number of sites N.
        edges: list of [i, j]: the bonds (a repeated pair is one bond).
        next_edges: list of [i, j]: the next_bonds, or null for none.
        positions: [N][d] site coordinates, or null (all sites at the origin, d = 1).
        pbc: whether the models that convolve along the site order (the CNN) wrap around from
            the last site to the first; the edges say what the Hamiltonian joins.
        total_sz: null, or the fixed total S^z.
    """
    require_int("n_sites", n_sites, minimum=1)
    require_bool("pbc", pbc)
    bonds = lattice.unique_bonds(_pairs("edges", edges, n_sites))
    next_bonds = lattice.unique_bonds(_pairs("next_edges", next_edges or [], n_sites))
    if positions is None:
        coords = np.zeros((n_sites, 1))
    else:
        coords = np.asarray(positions, dtype=float) if isinstance(positions, (list, tuple)) else None
        if coords is None or coords.ndim != 2 or coords.shape[0] != n_sites:
            raise ConfigError("positions", f"must be a list of {n_sites} coordinate lists of equal length")
    shared = {tuple(b) for b in bonds} & {tuple(b) for b in next_bonds}
    return Hilbert(
        n_sites=n_sites,
        bonds=bonds,
        next_bonds=next_bonds,
        sublattice=lattice.bipartite_coloring(n_sites, bonds),
        total_sz=_check_total_sz(n_sites, total_sz),
        shape=(n_sites,),
        pbc=pbc,
        positions=coords,
        translations=np.arange(n_sites, dtype=np.int32)[None, :],
        momenta=np.zeros((1, coords.shape[1])),
        next_bonds_issue=f"the pair {min(shared)} is in both edges and next_edges" if shared else None,
        space_group=groups.identity(n_sites, coords.shape[1]),
    )


def all_states(hilbert: Hilbert) -> np.ndarray:
    """Every basis state of the (constrained) space, int8 [n_states, N], in binary order (with
    copies, total_sz in each).

    Site 0 is the most significant bit; bit 1 means spin up (+1).
    """
    n = hilbert.n_sites
    codes = np.arange(2**n, dtype=np.int64)
    if hilbert.total_sz is not None:
        width = n // hilbert.copies
        keep = np.ones(len(codes), bool)
        for copy in range(hilbert.copies):
            ups = np.zeros_like(codes)
            for k in range(copy * width, (copy + 1) * width):
                ups += (codes >> k) & 1
            keep &= ups == hilbert.n_up
        codes = codes[keep]
    return codes_to_states(codes, n)


def codes_to_states(codes: np.ndarray, n_sites: int) -> np.ndarray:
    """int8 [D, N] spins of integer codes [D] (site 0 the most significant bit, 1 = up)."""
    bits = (codes[:, None] >> np.arange(n_sites - 1, -1, -1)) & 1
    return (2 * bits - 1).astype(np.int8)


def states_to_codes(states: np.ndarray) -> np.ndarray:
    """Integer codes [...] of spins [..., N], the inverse of `codes_to_states`."""
    n = states.shape[-1]
    bits = (np.asarray(states) > 0).astype(np.int64)
    return bits @ (1 << np.arange(n - 1, -1, -1, dtype=np.int64))
