"""Spin-1/2 Hilbert spaces on lattices: sites, bonds, sublattices and the Sz sector."""

import itertools
import math
from typing import NamedTuple

import numpy as np

from runner.errors import ConfigError, require_bool, require_int


class Hilbert(NamedTuple):
    """A lattice of spin-1/2 sites. Spins are stored as +1 (up) / -1 (down).

    Attributes:
        n_sites: number of sites N.
        bonds: int array [B, 2], nearest-neighbour pairs (i < j, no duplicates).
        next_bonds: int array [B2, 2], next-nearest neighbours (distance 2 on a chain,
            diagonals on a square lattice).
        sublattice: int array [N] with 0/1 for a bipartite lattice, or None.
        total_sz: None (no constraint) or the total S^z in units of hbar (sum of s_i/2).
        shape: lattice extents, e.g. (L,) or (Lx, Ly).
        pbc: periodic boundaries.
    """

    n_sites: int
    bonds: np.ndarray
    next_bonds: np.ndarray
    sublattice: np.ndarray | None
    total_sz: float | None
    shape: tuple
    pbc: bool

    @property
    def n_up(self) -> int | None:
        """Number of up spins fixed by `total_sz`, or None."""
        if self.total_sz is None:
            return None
        return int(round(self.n_sites / 2 + self.total_sz))

    @property
    def n_states(self) -> int:
        """Dimension of the (constrained) Hilbert space."""
        if self.total_sz is None:
            return 2**self.n_sites
        return math.comb(self.n_sites, self.n_up)


def _unique_bonds(pairs):
    out = sorted({(min(i, j), max(i, j)) for i, j in pairs if i != j})
    return np.asarray(out, dtype=np.int32).reshape(-1, 2)


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


def _bipartite_coloring(n_sites, bonds):
    """Two-colours the bond graph, or returns None when it is not bipartite."""
    color = -np.ones(n_sites, dtype=np.int32)
    adjacency = [[] for _ in range(n_sites)]
    for i, j in bonds:
        adjacency[i].append(j)
        adjacency[j].append(i)
    for start in range(n_sites):
        if color[start] >= 0:
            continue
        color[start] = 0
        stack = [start]
        while stack:
            i = stack.pop()
            for j in adjacency[i]:
                if color[j] < 0:
                    color[j] = 1 - color[i]
                    stack.append(j)
                elif color[j] == color[i]:
                    return None
    return color


def _make(shape, bonds, next_bonds, pbc, total_sz):
    n_sites = int(np.prod(shape))
    bonds = _unique_bonds(bonds)
    return Hilbert(
        n_sites=n_sites,
        bonds=bonds,
        next_bonds=_unique_bonds(next_bonds),
        sublattice=_bipartite_coloring(n_sites, bonds),
        total_sz=_check_total_sz(n_sites, total_sz),
        shape=tuple(shape),
        pbc=pbc,
    )


def chain(L: int, pbc: bool = True, total_sz: float | None = None) -> Hilbert:
    """A chain of L spins; next-nearest neighbours are at distance 2."""
    require_int("L", L, minimum=2)
    require_bool("pbc", pbc)
    if pbc and L < 3:
        raise ConfigError("L", f"must be at least 3 with pbc=true (got {L})")
    wrap = (lambda i: i % L) if pbc else (lambda i: i if i < L else None)
    nn = [(i, wrap(i + 1)) for i in range(L) if wrap(i + 1) is not None]
    nnn = [(i, wrap(i + 2)) for i in range(L) if wrap(i + 2) is not None]
    return _make((L,), nn, nnn, pbc, total_sz)


def square(
    L: int | None = None,
    Lx: int | None = None,
    Ly: int | None = None,
    pbc: bool = True,
    total_sz: float | None = None,
) -> Hilbert:
    """An Lx x Ly square lattice (Lx = Ly = L unless given); site index is x * Ly + y."""
    Lx = L if Lx is None else Lx
    Ly = L if Ly is None else Ly
    if Lx is None or Ly is None:
        raise ConfigError("L", "must be set (or both Lx and Ly)")
    require_int("Lx" if Lx is not L else "L", Lx, minimum=2)
    require_int("Ly" if Ly is not L else "L", Ly, minimum=2)
    require_bool("pbc", pbc)
    if pbc and min(Lx, Ly) < 3:
        raise ConfigError("L", f"must be at least 3 in each direction with pbc=true (got {Lx}x{Ly})")

    def site(x, y):
        if pbc:
            return (x % Lx) * Ly + (y % Ly)
        if 0 <= x < Lx and 0 <= y < Ly:
            return x * Ly + y
        return None

    nn, nnn = [], []
    for x, y in itertools.product(range(Lx), range(Ly)):
        i = site(x, y)
        for dx, dy, out in ((1, 0, nn), (0, 1, nn), (1, 1, nnn), (1, -1, nnn)):
            j = site(x + dx, y + dy)
            if j is not None:
                out.append((i, j))
    return _make((Lx, Ly), nn, nnn, pbc, total_sz)


def all_states(hilbert: Hilbert) -> np.ndarray:
    """Every basis state of the (constrained) space, int8 [n_states, N], in binary order.

    Site 0 is the most significant bit; bit 1 means spin up (+1).
    """
    n = hilbert.n_sites
    codes = np.arange(2**n, dtype=np.int64)
    if hilbert.total_sz is not None:
        ups = np.zeros_like(codes)
        for k in range(n):
            ups += (codes >> k) & 1
        codes = codes[ups == hilbert.n_up]
    return codes_to_states(codes, n)


def codes_to_states(codes: np.ndarray, n_sites: int) -> np.ndarray:
    bits = (codes[:, None] >> np.arange(n_sites - 1, -1, -1)) & 1
    return (2 * bits - 1).astype(np.int8)


def states_to_codes(states: np.ndarray) -> np.ndarray:
    n = states.shape[-1]
    bits = (np.asarray(states) > 0).astype(np.int64)
    return bits @ (1 << np.arange(n - 1, -1, -1, dtype=np.int64))
