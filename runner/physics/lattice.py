"""Lattice geometry: primitive vectors and bases, distance shells, translations and momenta.
`space_group` finds the space group from this geometry; `hilbert` puts spins on the sites built
here and carries that group."""

import itertools
import math
from typing import NamedTuple

import numpy as np

from runner.errors import ConfigError

_S3 = math.sqrt(3.0) / 2
# Primitive vectors (rows) and basis positions of each Bravais lattice.
GEOMETRY = {
    "chain": (np.array([[1.0]]), np.array([[0.0]])),
    "square": (np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([[0.0, 0.0]])),
    "triangular": (np.array([[1.0, 0.0], [0.5, _S3]]), np.array([[0.0, 0.0]])),
    "honeycomb": (np.array([[1.0, 0.0], [0.5, _S3]]), np.array([[0.0, 0.0], [0.5, _S3 / 3]])),
    "kagome": (np.array([[1.0, 0.0], [0.5, _S3]]), np.array([[0.0, 0.0], [0.5, 0.0], [0.25, _S3 / 2]])),
}
# Order of the rotations in each lattice's point group (C_n, with the n mirrors: C_nv).
ROTATION_ORDER = {"chain": 2, "square": 4, "triangular": 6, "honeycomb": 6, "kagome": 6}


class Sites(NamedTuple):
    """A finite lattice's sites, shells and translations (the fields of `hilbert.Hilbert` of the
    same names)."""

    n_sites: int
    bonds: np.ndarray
    next_bonds: np.ndarray
    sublattice: np.ndarray | None
    positions: np.ndarray
    translations: np.ndarray
    momenta: np.ndarray
    next_bonds_issue: str | None
    three_sublattice: np.ndarray | None = None


def unique_bonds(pairs):
    """int32 [B, 2]: each pair once, i < j, sorted; self-pairs dropped."""
    out = sorted({(min(i, j), max(i, j)) for i, j in pairs if i != j})
    return np.asarray(out, dtype=np.int32).reshape(-1, 2)


def bipartite_coloring(n_sites, bonds):
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


def three_sublattice(kind, extents, pbc):
    """int32 [N] k = (x - y) mod 3 of each site of a triangular lattice (cell (x, y)): the three
    sublattices of the 120-degree pattern, every bond joining two of them; None for another kind,
    or a torus with an extent that is not a multiple of 3 (the pattern would not close)."""
    if kind != "triangular" or (pbc and any(e % 3 for e in extents)):
        return None
    cells = np.array(list(itertools.product(*(range(e) for e in extents))))
    return ((cells[:, 0] - cells[:, 1]) % 3).astype(np.int32)


def shell_offsets(vectors, basis):
    """Per basis site b, the (b2, cell offset, shell) of its first two distance shells on the
    infinite lattice, shell 0 = nearest."""
    d = vectors.shape[0]
    cells = list(itertools.product(range(-3, 4), repeat=d))
    found = []
    for b, rb in enumerate(basis):
        for b2, rb2 in enumerate(basis):
            for cell in cells:
                dist = np.linalg.norm(np.asarray(cell) @ vectors + rb2 - rb)
                if dist > 1e-9:
                    found.append((round(dist, 9), b, b2, cell))
    d1, d2 = sorted({f[0] for f in found})[:2]
    offsets = [[] for _ in basis]
    for dist, b, b2, cell in found:
        if dist in (d1, d2):
            offsets[b].append((b2, cell, 0 if dist == d1 else 1))
    return offsets


def point_operations(kind):
    """The linear parts [P, d, d] of the point group, identity first: rotations by 2 pi k / n,
    then each composed with the mirror y -> -y (x -> -x for the chain)."""
    if kind == "chain":
        return np.array([[[1.0]], [[-1.0]]])
    n = ROTATION_ORDER[kind]
    rotations = [np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]]) for a in 2 * np.pi * np.arange(n) / n]
    return np.array(rotations + [r @ np.diag([1.0, -1.0]) for r in rotations])


def site_of(points_MxD, vectors, basis, extents, pbc, tol=1e-6):
    """The site index at each point [M] (wrapped onto the torus with pbc), -1 where none lies."""
    inverse = np.linalg.inv(vectors)
    frac_MxD = points_MxD @ inverse
    found = -np.ones(len(points_MxD), np.int64)
    for b, rb in enumerate(basis):
        cell_MxD = np.round(frac_MxD - rb @ inverse)
        miss = np.linalg.norm(points_MxD - cell_MxD @ vectors - rb, axis=-1)
        extent = np.asarray(extents)
        cell_MxD = cell_MxD.astype(np.int64)
        if pbc:
            cell_MxD %= extent
        inside = (miss < tol) & np.all((cell_MxD >= 0) & (cell_MxD < extent), axis=-1)
        flat = np.ravel_multi_index(tuple(np.clip(cell_MxD, 0, extent - 1).T), extents)
        found = np.where(inside, flat * len(basis) + b, found)
    return found


def _cell_index(cell, b, extents, n_basis):
    """The site index of basis site b in unit cell `cell`: (x * Ly + y) * n_basis + b."""
    flat = 0
    for c, e in zip(cell, extents):
        flat = flat * e + c
    return flat * n_basis + b


def _shells(kind, cells, extents, pbc, size_keys):
    """The first and second distance shells as sets of pairs (i < j), and why next_bonds cannot
    carry a coupling (None when they can). A site that is its own nearest neighbour through the
    boundary is refused, naming its size key."""
    vectors, basis = GEOMETRY[kind]
    shells = (set(), set())
    self_images = [None, None]
    for cell in cells:
        for b, offsets in enumerate(shell_offsets(vectors, basis)):
            i = _cell_index(cell, b, extents, len(basis))
            for b2, delta, shell in offsets:
                target = [c + o for c, o in zip(cell, delta)]
                if pbc:
                    target = [t % e for t, e in zip(target, extents)]
                elif any(not 0 <= t < e for t, e in zip(target, extents)):
                    continue
                j = _cell_index(target, b2, extents, len(basis))
                if j == i:
                    axis = next(a for a, o in enumerate(delta) if o)
                    self_images[shell] = self_images[shell] or (i, size_keys[axis])
                else:
                    shells[shell].add((min(i, j), max(i, j)))
    if self_images[0]:
        site, key = self_images[0]
        raise ConfigError(
            key, f"is too small with pbc=true: site {site} would be its own nearest neighbour through the boundary"
        )
    issue = None
    if self_images[1]:
        issue = f"site {self_images[1][0]} is its own next-nearest neighbour through the periodic boundary"
    elif shells[0] & shells[1]:
        pair = min(shells[0] & shells[1])
        issue = f"the pair {pair} is both a nearest and a next-nearest neighbour through the periodic boundary"
    return shells, issue


def build(kind, extents, pbc, size_keys) -> Sites:
    """Sites, shells, translations and momenta of `kind` on `extents` unit cells.

    Periodic images: a pair joined through several images within one shell is one bond.
    A site that is its own nearest neighbour through the boundary is refused; a site that
    is its own second neighbour, or a pair in both shells, leaves `next_bonds_issue` set.
    """
    vectors, basis = GEOMETRY[kind]
    nb, d = len(basis), vectors.shape[0]
    extents = tuple(extents)
    cells = list(itertools.product(*(range(e) for e in extents)))
    shells, issue = _shells(kind, cells, extents, pbc, size_keys)
    positions = np.array([np.asarray(cell) @ vectors + rb for cell in cells for rb in basis]).reshape(-1, d)
    moves = cells if pbc else [tuple(0 for _ in extents)]
    translations = np.array(
        [[_cell_index([(c + m) % e for c, m, e in zip(cell, move, extents)], b, extents, nb)
          for cell in cells for b in range(nb)] for move in moves],
        np.int32,
    )
    reciprocal = 2 * np.pi * np.linalg.inv(vectors).T
    momenta = np.array([(np.asarray(m) / np.asarray(extents)) @ reciprocal for m in cells]).reshape(-1, d)
    bonds, next_bonds = unique_bonds(shells[0]), unique_bonds(shells[1])
    return Sites(
        n_sites=len(positions),
        bonds=bonds,
        next_bonds=next_bonds,
        sublattice=bipartite_coloring(len(positions), bonds),
        positions=positions,
        translations=translations,
        momenta=momenta,
        next_bonds_issue=issue,
        three_sublattice=three_sublattice(kind, extents, pbc),
    )
