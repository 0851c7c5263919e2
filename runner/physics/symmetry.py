"""Symmetry sectors of a lattice: the little group of a momentum in the space group the Hilbert
space carries (`runner.physics.space_group.SpaceGroup`), the one-dimensional irreps of that little
group, and the sectors they label.

Conventions. Element g = {R | t} maps a point x to R (x - c) + c + t: R a point operation about
the centre c of the lattice's point group (chain, square, triangular: a site; honeycomb and
kagome: a hexagon centre), t a lattice vector. On a configuration it acts as (g s)_i =
s_{perm_g[i]} (`perm_g[i]` the image of site i), and U(g) psi(s) = psi(g s) moves the spins along g
(U(g) U(h) = U(g h), g h = h first). A momentum is the integer tuple m, k = sum_a m_a / L_a b_a
(b_a . a_b = 2 pi delta_ab, 0 <= m_a < L_a). A sector (k, irrep, parity) holds the states with

    U({R | t}) psi = exp(i k . t) chi_irrep(R) psi    for every R in the little co-group of k,

and F psi = parity psi for the spin flip F. Its projector is P = (1/|G_k|) sum_g chi(g)* U(g)
over the little group G_k (times (1 + parity F) / 2), so P psi(s) = (1/|G_k|) sum_g chi(g)*
psi(g s); on the translations chi(t)* = exp(-i k . d_t). A model's `sector` projects with these
weights (`models.symmetrize`).

Irrep names (Mulliken) of the little co-groups that occur: C1: A. Cs (one mirror; the chain's
reflection): A' (even), A'' (odd). C2: A, B (odd under the rotation by pi). Cnv, n = 2, 3, 4, 6:
A1 (all +1), A2 (mirrors -1) and, for even n, B1, B2 (odd rotations by 2 pi / n): B1 is even
under the reference mirror, the one whose axis makes the smallest angle in [0, pi) with a1, and
under every mirror whose axis lies an even multiple of pi / n from it; B2 is odd under those.
The two-dimensional irreps E of C3v, C4v, C6v are not sectors here.
"""

import itertools
from typing import NamedTuple

import numpy as np

from runner.errors import ConfigError

from runner.physics import pauli
from runner.physics import space_group as groups
from runner.physics.hilbert import Hilbert, all_states, states_to_codes
from runner.physics.space_group import SpaceGroup

SYMMETRY_ZERO_LOG = 20.0  # log |psi| this far below the largest: a zero of psi (a symmetry's), |psi|^2 ratio < 5e-18


class Sector(NamedTuple):
    """A symmetry sector: momentum m, a 1-D irrep of the little co-group of k, spin-flip parity.

    Attributes:
        momentum: m, k = sum_a m_a / L_a b_a with 0 <= m_a < L_a.
        irrep: the irrep's name (see the module docstring).
        parity: the eigenvalue +1 / -1 of the spin flip, or None (no flip symmetry used).
        sz: the sector's total S^z (the Hilbert space's `total_sz`), or None (not fixed).
    """

    momentum: tuple
    irrep: str
    parity: int | None = None
    sz: float | None = None

    @property
    def name(self) -> str:
        """The sector as a string, e.g. `k=(0,1) A1 P=+1` (no P without parity)."""
        flip = "" if self.parity is None else f" P={self.parity:+d}"
        return f"k=({','.join(str(m) for m in self.momentum)}) {self.irrep}{flip}"


def space_group(hilbert: Hilbert) -> SpaceGroup:
    """The space group `hilbert` carries (found once when it was built, `hilbert.Hilbert.space_group`);
    the identity alone where it carries none."""
    if hilbert.space_group is not None:
        return hilbert.space_group
    return groups.identity(hilbert.n_sites, np.asarray(hilbert.positions).shape[1])


def kept_group(hamiltonian, group: SpaceGroup) -> SpaceGroup:
    """The subgroup of `group` whose elements commute with the Pauli sum `hamiltonian` (U(g) H U(g)^dagger
    = H): `group` itself when H has the whole symmetry (a phase prior keeps part of it). The elements
    H commutes with form a group; with every translation among them it is the kept point operations
    times the translations, so one element per point operation decides (`pauli.commutes_with`).
    Where a kept little co-group is a rotation group C_n, n > 2, without mirrors (complex 1-D
    irreps, which `irreps` does not name), only the translations are kept.

    Raises:
        ValueError: H does not commute with every translation (no momentum labels its sectors).
    """
    translation_E = np.nonzero(group.op_E == 0)[0]
    firsts = [int(np.nonzero(group.op_E == p)[0][0]) for p in range(len(group.ops))]
    commutes_T = pauli.commutes_with(hamiltonian, group.perm_ExN[translation_E])
    if not commutes_T.all():
        e = int(translation_E[np.argmin(commutes_T)])
        raise ValueError(f"the Hamiltonian does not commute with the translation {e} {group.names[e]}")
    commutes_P = pauli.commutes_with(hamiltonian, group.perm_ExN[firsts])
    if commutes_P.all():
        return group
    kept = group.restricted(np.nonzero(commutes_P)[0])
    try:
        for m in momenta(kept):
            little_group_irreps(kept, m)
    except ValueError:
        return group.restricted([0])
    return kept


def keeping(hilbert: Hilbert, hamiltonian) -> Hilbert:
    """`hilbert` carrying the space group `hamiltonian` keeps (`kept_group`) in place of the lattice's, so
    that every consumer of `space_group` (sectors, the spectrum, the full sum's orbits, the
    symmetric models) uses the symmetry of the problem simulated; `hilbert` itself where H keeps
    the whole group, carries none, or lacks a translation (then the sectors refuse H, as before).
    """
    if hilbert.space_group is None:
        return hilbert
    try:
        kept = kept_group(hamiltonian, hilbert.space_group)
    except ValueError:
        return hilbert
    return hilbert if kept is hilbert.space_group else hilbert._replace(space_group=kept)


def act_on_momentum(group: SpaceGroup, op: int, momentum) -> tuple:
    """The momentum R k of point operation `op`, as the integer tuple m' (0 <= m'_a < L_a)."""
    L = np.asarray(group.extents, float)
    inverse = np.linalg.inv(group.vectors)
    # b_a are the rows of 2 pi inv(V)^T; R k in that basis is (m / L) inv(V)^T R^T V^T.
    frac = (np.asarray(momentum) / L) @ inverse.T @ group.ops[op].T @ group.vectors.T * L
    if np.max(np.abs(frac - np.round(frac)), initial=0.0) > 1e-9:
        raise ValueError(f"point operation {op} does not map the momentum grid onto itself")
    return tuple(int(m) for m in np.round(frac).astype(int) % group.extents)


def momenta(group: SpaceGroup) -> list:
    """Every momentum m of the torus, in increasing order."""
    return [tuple(m) for m in itertools.product(*(range(e) for e in group.extents))]


def star(group: SpaceGroup, momentum) -> list:
    """The momenta R k over the point group, sorted: sectors at these are degenerate."""
    return sorted({act_on_momentum(group, p, momentum) for p in range(len(group.ops))})


def little_cogroup(group: SpaceGroup, momentum) -> list:
    """Indices of the point operations R with R k = k modulo the reciprocal lattice."""
    momentum = tuple(momentum)
    return [p for p in range(len(group.ops)) if act_on_momentum(group, p, momentum) == momentum]


def irreps(ops) -> tuple:
    """(group name, {irrep name: characters [len(ops)]}) of the one-dimensional irreps of the
    point group `ops` [P, d, d] (identity included), named as in the module docstring.

    Raises ValueError for a rotation group C_n with n > 2 and no mirror (its 1-D irreps are
    complex; no lattice here has one as a little co-group).
    """
    n, kinds = groups.classify(np.asarray(ops))
    mirrors = any(m for m, _ in kinds)
    if not mirrors and n > 2:
        raise ValueError(f"the point group C{n} without mirrors is not supported")
    rot = np.array([1.0 if m else (-1.0) ** j for m, j in kinds])  # (-1)^j on rotations
    sigma = np.array([(-1.0) ** j if m else 1.0 for m, j in kinds])  # B1's sign on mirrors
    is_mirror = np.array([m for m, _ in kinds])
    ones = np.ones(len(kinds))
    odd_mirrors = np.where(is_mirror, -1.0, 1.0)
    if not mirrors:
        return (f"C{n}", {"A": ones, "B": rot} if n == 2 else {"A": ones})
    if n == 1:
        return "Cs", {"A'": ones, "A''": odd_mirrors}
    table = {"A1": ones, "A2": odd_mirrors}
    if n % 2 == 0:
        table["B1"] = np.where(is_mirror, sigma, rot)
        table["B2"] = np.where(is_mirror, -sigma, rot)
    return f"C{n}v", table


def little_group_irreps(group: SpaceGroup, momentum) -> tuple:
    """(group name, {irrep name: characters}) of the little co-group of k (see `irreps`)."""
    return irreps(group.ops[little_cogroup(group, momentum)])


def with_2d_irreps(group: SpaceGroup) -> dict:
    """{momentum: little co-group name} for the star representatives whose little co-group (C3v,
    C4v, C6v) has 2-D irreps: the states no listed sector holds lie there."""
    names = {m: little_group_irreps(group, m)[0] for m in momenta(group) if star(group, m)[0] == m}
    return {m: name for m, name in names.items() if name in ("C3v", "C4v", "C6v")}


def characters(group: SpaceGroup, sector: Sector):
    """The little group's elements and the sector's characters on them.

    Returns:
        (element indices [E_k] into `group`, in order; identity first,
         complex128 [E_k] chi(g) = exp(i k . t) chi_irrep(R) for g = {R | t}).
    """
    little = little_cogroup(group, sector.momentum)
    _, table = irreps(group.ops[little])
    if sector.irrep not in table:
        raise ValueError(f"{sector.irrep} is not a 1-D irrep of the little group of k={sector.momentum}")
    chi_R = dict(zip(little, table[sector.irrep]))
    elements = np.array([e for e, p in enumerate(group.op_E) if p in chi_R])
    phase = group.shift_ExD[elements] @ (np.asarray(sector.momentum) / np.asarray(group.extents))
    chi = np.exp(2j * np.pi * phase) * np.array([chi_R[p] for p in group.op_E[elements]])
    return elements, chi


def parities(hilbert: Hilbert) -> tuple:
    """The spin-flip parities a sector of `hilbert` may carry: (1, -1) when the flip maps the
    space onto itself (total_sz null or 0), () otherwise."""
    return (1, -1) if hilbert.total_sz is None or hilbert.total_sz == 0 else ()


def check_fits(hilbert: Hilbert, sector: Sector) -> None:
    """ValueError unless the sector lives in `hilbert`'s space: a parity only with total_sz null
    or 0, and sz null or `hilbert.total_sz`."""
    if sector.parity is not None and sector.parity not in parities(hilbert):
        raise ValueError(f"{sector.name}: spin-flip parity needs total_sz null or 0 (got {hilbert.total_sz})")
    if sector.sz is not None and sector.sz != hilbert.total_sz:
        raise ValueError(f"{sector.name} has sz={sector.sz}, the space total_sz={hilbert.total_sz}")


def sectors(hilbert: Hilbert, parity: bool = False, stars: bool = True, group: SpaceGroup | None = None) -> list:
    """Every sector with a 1-D irrep: per momentum (one per star when `stars`), each 1-D irrep
    of its little co-group, each spin-flip parity when `parity`.

    The sectors listed miss the states of 2-D irreps (E of C3v, C4v, C6v);
    `runner.physics.spectrum` counts them.
    """
    group = space_group(hilbert) if group is None else group
    flips = parities(hilbert) if parity else (None,)
    if parity and not flips:
        raise ValueError(f"spin-flip parity needs total_sz null or 0 (got {hilbert.total_sz})")
    chosen = [m for m in momenta(group) if not stars or star(group, m)[0] == m]
    return [Sector(m, name, p, hilbert.total_sz)
            for m in chosen for name in little_group_irreps(group, m)[1] for p in flips]


def trivial_sector(hilbert: Hilbert, group: SpaceGroup | None = None) -> Sector:
    """k = 0 with the fully symmetric irrep of its little co-group (A1, A' or A) and no parity."""
    group = space_group(hilbert) if group is None else group
    zero = (0,) * len(group.extents)
    _, table = little_group_irreps(group, zero)
    return Sector(zero, next(iter(table)), None, hilbert.total_sz)  # `irreps` lists the trivial one first


def parse_sector(spec, hilbert: Hilbert, key: str = "sector", group: SpaceGroup | None = None):
    """A user's sector: null (None), `auto` (the string) or {momentum: [m1, m2], irrep: B1,
    parity: -1} (parity optional) as a `Sector`; ConfigError naming the allowed values."""
    if spec is None or spec in ("null", "auto"):
        return None if spec in (None, "null") else "auto"
    if not isinstance(spec, dict) or not {"momentum", "irrep"} <= set(spec) <= {"momentum", "irrep", "parity"}:
        raise ConfigError(key, f"must be null, auto or {{momentum: [m1, m2], irrep: A1, parity: 1}} "
                               f"(parity optional) (got {spec!r})")
    group = space_group(hilbert) if group is None else group
    extents, m = group.extents, spec["momentum"]
    if (not isinstance(m, (list, tuple)) or len(m) != len(extents)
            or any(isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < e for x, e in zip(m, extents))):
        ranges = ", ".join(f"0..{e - 1}" for e in extents)
        raise ConfigError(f"{key}.momentum", f"must be a list of {len(extents)} integers in {ranges} (got {m!r})")
    name, table = little_group_irreps(group, m)
    if spec["irrep"] not in table:
        raise ConfigError(f"{key}.irrep", f"must be one of {', '.join(table)}, the 1-D irreps of the little "
                                          f"group {name} of k={tuple(m)} (got {spec['irrep']!r})")
    parity = spec.get("parity")
    if parity is not None and (isinstance(parity, bool) or parity not in parities(hilbert)):
        allowed = "null, 1 or -1" if parities(hilbert) else f"null (total_sz={hilbert.total_sz} is not 0)"
        raise ConfigError(f"{key}.parity", f"must be {allowed} (got {parity!r})")
    return Sector(tuple(m), spec["irrep"], parity, hilbert.total_sz)


def basis_codes(hilbert: Hilbert) -> np.ndarray:
    """int64 [D] the codes of `all_states(hilbert)` (increasing; site 0 the most significant bit)."""
    return states_to_codes(all_states(hilbert))


def image_codes(codes_D, perm_N, n_sites: int) -> np.ndarray:
    """int64 [D] the codes of g s (g s)_i = s_{perm[i]} for the configurations of `codes_D`."""
    codes_D = np.asarray(codes_D, np.int64)
    out = np.zeros_like(codes_D)
    for i, j in enumerate(np.asarray(perm_N).tolist()):
        out |= ((codes_D >> (n_sites - 1 - j)) & 1) << (n_sites - 1 - i)
    return out


def project(hilbert: Hilbert, sector: Sector, v_D, group: SpaceGroup | None = None) -> np.ndarray:
    """P v for amplitudes v [D] on `all_states(hilbert)`: the projection onto `sector`,
    P v(s) = (1/|G_k|) sum_g chi(g)* v(g s), times (v(s) + parity v(F s)) / 2 with parity.

    Returns:
        complex128 [D].
    """
    check_fits(hilbert, sector)
    group = space_group(hilbert) if group is None else group
    n, v_D = hilbert.n_sites, np.asarray(v_D)
    codes = basis_codes(hilbert)
    elements, chi = characters(group, sector)
    out = np.zeros(len(codes), np.complex128)
    for e, c in zip(elements, chi):
        image = image_codes(codes, group.perm_ExN[e], n)
        term = v_D[np.searchsorted(codes, image)]
        if sector.parity is not None:
            term = (term + sector.parity * v_D[np.searchsorted(codes, image ^ ((1 << n) - 1))]) / 2
        out += np.conj(c) * term
    return out / len(elements)
