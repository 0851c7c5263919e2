"""The space group of a lattice, found once from its geometry when the Hilbert space is built and
carried by it (`hilbert.Hilbert.space_group`): every consumer (the sectors, the spectrum, the full
sum, the symmetric models, the sector diagnostics) reads this one value.

Element g = {R | t} maps a point x to R (x - c) + c + t: R a point operation about the centre c
of the lattice's point group (chain, square, triangular: a site; honeycomb and kagome: a hexagon
centre), t a lattice vector. On a configuration it acts as (g s)_i = s_{perm_g[i]}. Elements are
every kept point operation (identity first) times every translation (translations inner, in the
order of `Hilbert.translations`), so on a small torus two elements may share a row.

Groups are named in one vocabulary (`SUBGROUPS`, `SpaceGroup.rows`): none (the identity),
translations, lattice (the whole space group as distinct rows). The sectors of `symmetry` name
the one-dimensional irreps of its little groups.
"""

import hashlib
import itertools
import math

import numpy as np

from runner.physics.lattice import GEOMETRY, point_operations, site_of

SUBGROUPS = ("none", "translations", "lattice")  # the names a config gives a symmetry group of the lattice


class SpaceGroup:
    """A lattice's space group as elements {R | t}, R first, then t: a frozen value, equal and
    hashed by content (arrays read-only).

    Attributes:
        perm_ExN: int32 [E, N], site i -> perm[e, i]; every kept point operation with every
            translation (E = P x T).
        op_E: int [E], the element's point operation (an index into `ops`).
        shift_ExD: int [E, d], the cell offset of its translation (t = shift @ vectors).
        ops: float [P, d, d], the point operations the finite lattice keeps, identity first.
        vectors: float [d, d], the primitive vectors (rows).
        extents: the momentum grid: L_a per direction (1 without translations along a).
        center: float [d], the point every operation fixes.
        lattice_order: int [G] the elements of the distinct rows in the order `rows("lattice")`
            lists them (each point operation's coset from the member that maps site 0 lowest,
            times the translations; a row seen before left out).
    """

    __slots__ = ("perm_ExN", "op_E", "shift_ExD", "ops", "vectors", "extents", "center", "lattice_order", "_key")

    def __init__(self, perm_ExN, op_E, shift_ExD, *, ops, vectors, extents, center, lattice_order=None):
        arrays = {
            "perm_ExN": np.asarray(perm_ExN, np.int32), "op_E": np.asarray(op_E, int),
            "shift_ExD": np.asarray(shift_ExD, int), "ops": np.asarray(ops, float),
            "vectors": np.asarray(vectors, float), "center": np.asarray(center, float),
        }
        if lattice_order is None:
            lattice_order = _lattice_order(arrays["perm_ExN"], arrays["op_E"])
        arrays["lattice_order"] = np.asarray(lattice_order, int)
        for name, value in arrays.items():
            value.flags.writeable = False
            object.__setattr__(self, name, value)
        object.__setattr__(self, "extents", tuple(int(e) for e in extents))
        digest = hashlib.blake2b(repr(self.extents).encode())
        for name in sorted(arrays):
            digest.update(name.encode() + repr(arrays[name].shape).encode() + arrays[name].tobytes())
        object.__setattr__(self, "_key", digest.hexdigest())

    def __setattr__(self, name, value):
        raise AttributeError("a SpaceGroup is frozen")

    def __eq__(self, other):
        return isinstance(other, SpaceGroup) and self._key == other._key

    def __hash__(self):
        return hash(self._key)

    def __repr__(self):
        return f"SpaceGroup({len(self.perm_ExN)} elements on {self.n_sites} sites, {len(self.ops)} point operations)"

    def __reduce__(self):
        return _rebuilt, (self.perm_ExN, self.op_E, self.shift_ExD, {
            "ops": self.ops, "vectors": self.vectors, "extents": self.extents, "center": self.center,
            "lattice_order": self.lattice_order})

    def __array__(self, dtype=None, copy=None):
        """The whole group's distinct rows, `rows("lattice")` (what `Hilbert.space_group` held as an array)."""
        return self.rows("lattice") if dtype is None else self.rows("lattice").astype(dtype)

    @property
    def n_sites(self) -> int:
        return self.perm_ExN.shape[1]

    @property
    def n_translations(self) -> int:
        return int(np.sum(self.op_E == 0))

    def rows(self, name: str) -> np.ndarray:
        """int32 [G, N] the site permutations of a group named in `SUBGROUPS`: none (the identity),
        translations (in the order of `Hilbert.translations`, identity first), lattice (every
        distinct row: identity first, then the translations, then each further point
        operation's coset)."""
        if name == "none":
            return np.arange(self.n_sites, dtype=np.int32)[None]
        if name == "translations":
            return self.perm_ExN[self.op_E == 0]
        if name == "lattice":
            return self.perm_ExN[self.lattice_order]
        raise ValueError(f"{name!r} is not a group of the lattice; one of {', '.join(SUBGROUPS)}")

    def restricted(self, keep_P) -> "SpaceGroup":
        """The subgroup of the elements whose point operation is in `keep_P` (indices into `ops`,
        0 the identity among them, closed under products): those operations, identity first, each
        with every translation."""
        keep = sorted({int(p) for p in keep_P})
        if keep[0] != 0:
            raise ValueError("a subgroup keeps the identity")
        new_of = {p: q for q, p in enumerate(keep)}
        chosen = np.isin(self.op_E, keep)
        return SpaceGroup(self.perm_ExN[chosen], [new_of[int(p)] for p in self.op_E[chosen]], self.shift_ExD[chosen],
                          ops=self.ops[keep], vectors=self.vectors, extents=self.extents, center=self.center)

    @property
    def names(self) -> tuple:
        """Each element's name, `{R | (t_1,t_2)}` with R as E (identity), C{n}^{j} (a rotation by
        2 pi j / n) or m{j} (the mirror whose axis lies j pi / n from the reference mirror's; see
        `symmetry`)."""
        n, kinds = classify(self.ops)
        labels = ["E" if not m and j == 0 else (f"m{j}" if m else f"C{n}^{j}") for m, j in kinds]
        return tuple(f"{{{labels[p]} | ({','.join(str(int(x)) for x in s)})}}"
                     for p, s in zip(self.op_E, self.shift_ExD))


def _rebuilt(perm_ExN, op_E, shift_ExD, rest: dict) -> SpaceGroup:
    """A SpaceGroup from its fields (what `SpaceGroup.__reduce__` gives pickle and copy)."""
    return SpaceGroup(perm_ExN, op_E, shift_ExD, **rest)


def identity(n_sites: int, d: int) -> SpaceGroup:
    """The group of the identity alone (a graph, or copies of a space)."""
    return SpaceGroup(np.arange(n_sites, dtype=np.int32)[None], np.zeros(1, int), np.zeros((1, d), int),
                      ops=np.eye(d)[None], vectors=np.eye(d), extents=(1,) * d, center=np.zeros(d),
                      lattice_order=np.zeros(1, int))


def _lattice_order(perm_ExN, op_E) -> list:
    """The elements giving each distinct row once: per point operation (in order), its coset's
    member that maps site 0 to the lowest site, composed with every translation (in order)."""
    translations = perm_ExN[op_E == 0]
    index = {}
    for e, row in enumerate(perm_ExN.tolist()):
        index.setdefault(tuple(row), e)
    order, seen = [], set()
    for p in sorted(set(op_E.tolist())):
        coset = perm_ExN[op_E == p]
        first = coset[np.argmin(coset[:, 0])]
        for shift in translations:
            row = tuple(shift[first].tolist())
            if row not in seen:
                seen.add(row)
                order.append(index[row])
    return order


def _on_lattice(point, vectors, basis) -> bool:
    inverse = np.linalg.inv(vectors)
    return any(np.max(np.abs((point - rb) @ inverse - np.round((point - rb) @ inverse))) < 1e-9 for rb in basis)


def _center(vectors, basis, ops):
    """The first point (fractions k/6 of the cell) about which every op maps the infinite lattice
    onto itself."""
    for frac in itertools.product(np.arange(6) / 6, repeat=len(vectors)):
        c = np.asarray(frac) @ vectors
        if all(_on_lattice(R @ (rb - c) + c, vectors, basis) for R in ops for rb in basis):
            return c
    raise ValueError("the lattice's point group fixes no point")


def _kept_operations(positions, extents, pbc, kind, center):
    """[(op index, site permutation)] of the ops about `center` that map the finite lattice onto
    itself (with pbc: those that also map the torus' periods onto periods; on an Lx != Ly square
    the rotations by 90 degrees do not, leaving C2v)."""
    vectors, basis = GEOMETRY[kind]
    periods = np.asarray(extents)[:, None] * vectors
    kept = []
    for p, R in enumerate(point_operations(kind)):
        if pbc:
            coeffs = (periods @ R.T) @ np.linalg.inv(periods)
            if not np.allclose(coeffs, np.round(coeffs), atol=1e-9):
                continue
        perm = site_of((positions - center) @ R.T + center, vectors, basis, extents, pbc)
        if np.all(perm >= 0) and len(set(perm.tolist())) == len(perm):
            kept.append((p, perm))
    return kept


def of_lattice(kind: str, positions, translations, extents, pbc: bool) -> SpaceGroup:
    """The space group of lattice `kind` on `extents` unit cells, found from the geometry: each
    point operation of `lattice.point_operations` about the point group's centre (the cluster's
    mean position with open boundaries) that sends every site onto a site, composed with every
    translation (rows of `translations`, identity first). Element 0 is the identity."""
    vectors, basis = GEOMETRY[kind]
    positions, translations, d = np.asarray(positions, float), np.asarray(translations), vectors.shape[0]
    all_ops = point_operations(kind)
    center = _center(vectors, basis, all_ops) if pbc else np.mean(positions, axis=0)
    kept = _kept_operations(positions, tuple(extents), pbc, kind, center)
    shifts = [np.unravel_index(row[0] // len(basis), tuple(extents)) for row in translations]
    perms, op_E, shift_E = [], [], []
    for p, (_, perm_R) in enumerate(kept):
        for row, shift in zip(translations, shifts):
            perms.append(row[perm_R])
            op_E.append(p)
            shift_E.append(shift)
    return SpaceGroup(np.asarray(perms, np.int32), np.asarray(op_E), np.asarray(shift_E, int).reshape(-1, d),
                      ops=all_ops[[p for p, _ in kept]], vectors=vectors, extents=tuple(extents) if pbc else (1,) * d,
                      center=center)


def classify(ops):
    """(rotation order n, [(is_mirror, j)] per op): a rotation is C_n^j; a mirror's axis lies
    j pi / n from the reference mirror's (the smallest axis angle in [0, pi) with the x axis)."""
    ops = np.asarray(ops)
    dets = [np.linalg.det(R) for R in ops]
    n = sum(1 for s in dets if s > 0)

    def angle(R):
        return math.atan2(R[1, 0], R[0, 0]) if len(R) == 2 else 0.0

    def axis(R):  # in [0, pi), an axis a hair below pi read as 0
        a = (angle(R) / 2) % math.pi
        return 0.0 if a > math.pi - 1e-9 else a

    ref = min((axis(R) for R, s in zip(ops, dets) if s < 0), default=0.0)
    out = []
    for R, s in zip(ops, dets):
        if s > 0:
            out.append((False, round(angle(R) / (2 * math.pi / n)) % n))
        else:
            out.append((True, round((axis(R) - ref) / (math.pi / n)) % n))
    return n, out
