"""The exact spectrum per symmetry sector: H as a sparse matrix in each sector's basis of projected
orbit representatives (`runner.physics.symmetry` gives the sectors and conventions).

The little group G_k (with the spin flip F when sectors carry a parity) splits the configurations
into orbits, each represented by r, its smallest code. A sector's basis vector of orbit O_r is

    |r~> = |O_r|^{-1/2} sum_{s in O_r} chi(g_s)* |s>,    g_s s = r,

which is sqrt(|O_r|) P|r>; an orbit whose stabiliser the character does not fix gives no vector.
As P U(g) = chi(g) P and H commutes with U(g),

    <r~|H|r'~> = sum over the configurations s' = r flipped by a mask of H with g_s' s' = r'
                 of <r|H|s'> chi(g_s')* sqrt(|O_r| / |O_r'|),

so only the representatives' elements are needed (`pauli.elements_np`), about D / |G_k| rows.
"""

import hashlib
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from runner.physics import exact
from runner.physics.hilbert import Hilbert, codes_to_states
from runner.physics.pauli import PauliSum, elements_np, not_invariant_under, to_sparse
from runner.physics.symmetry import (
    Sector,
    SpaceGroup,
    basis_codes,
    characters,
    check_fits,
    image_codes,
    parities,
    sectors,
    space_group,
    star,
    with_2d_irreps,
)

class _Orbits(NamedTuple):
    """The orbits of the little group G' (elements e, then e F when `flip`) on the basis.

    rep_D: position of each configuration's representative in `reps_R`; arg_D: the element g
    with g s = r (index into G'); stab_GxR: whether each element fixes each representative.
    """

    codes_D: np.ndarray
    rep_D: np.ndarray
    arg_D: np.ndarray
    reps_R: np.ndarray
    stab_GxR: np.ndarray


def _orbits(codes_D, perm_ExN, n_sites: int, flip: bool) -> _Orbits:
    """The orbits of the elements perm_ExN (and their products with the flip when `flip`) on the
    configurations codes_D (sorted), each represented by its smallest code."""
    mask = (1 << n_sites) - 1
    variants = (0, mask) if flip else (0,)
    best, arg = codes_D.copy(), np.zeros(len(codes_D), np.int32)
    images = []
    for e, perm in enumerate(perm_ExN):
        image = image_codes(codes_D, perm, n_sites)
        for f, x in enumerate(variants):
            better = (image ^ x) < best
            best[better] = (image ^ x)[better]
            arg[better] = e + f * len(perm_ExN)
    reps = codes_D[best == codes_D]
    for f, x in enumerate(variants):
        images += [image_codes(reps, perm, n_sites) ^ x for perm in perm_ExN]
    return _Orbits(codes_D, np.searchsorted(reps, best), arg, reps, np.stack(images) == reps)


def _index(codes_D, targets) -> np.ndarray:
    """Positions of `targets` in the sorted codes; ValueError where one is missing."""
    pos = np.minimum(np.searchsorted(codes_D, targets), len(codes_D) - 1)
    if not np.all(codes_D[pos] == targets):
        raise ValueError("the Hamiltonian leaves the Sz sector")
    return pos


def _connections(hamiltonian: PauliSum, orbits: _Orbits, n_sites: int):
    """(diag [R], rows, cols, args, elements): each representative's nonzero off-diagonal
    elements <r|H|s'>, with s' by its representative (col) and the element g_s' (arg)."""
    diag, groups = elements_np(hamiltonian, codes_to_states(orbits.reps_R, n_sites))
    rows, targets, mels = [], [], []
    for group, mel_RxK in groups:
        for k, sites in enumerate(group.flip_sites):
            mask = sum(1 << (n_sites - 1 - int(s)) for s in sites)
            r = np.nonzero(np.abs(mel_RxK[:, k]) > 0)[0]
            rows.append(r)
            targets.append(_index(orbits.codes_D, orbits.reps_R[r] ^ mask))
            mels.append(mel_RxK[r, k])
    rows, targets = (np.concatenate(x) if x else np.zeros(0, int) for x in (rows, targets))
    mels = np.concatenate(mels) if mels else np.zeros(0)
    return diag, rows, orbits.rep_D[targets], orbits.arg_D[targets], mels


def _full_characters(group: SpaceGroup, sector: Sector, flip: bool):
    """(elements of G_k, chi over G' = G_k then G_k F)."""
    elements, chi = characters(group, sector)
    return elements, np.concatenate([chi, (sector.parity or 0) * chi]) if flip else chi


def _kept(orbits: _Orbits, chi_G):
    """(which orbits give a basis vector [R], orbit sizes [R])."""
    stab = orbits.stab_GxR
    kept = np.abs(np.conj(chi_G) @ stab) > 0.5  # |Stab| where chi is 1 on it, else 0
    return kept, len(chi_G) / stab.sum(axis=0)


def _sector_matrix(connections, orbits: _Orbits, chi_G):
    """H in the sector's basis, sparse [d, d]."""
    diag, rows, cols, args, mels = connections
    kept, size = _kept(orbits, chi_G)
    new = np.cumsum(kept) - 1
    keep = kept[rows] & kept[cols]
    phase = np.conj(chi_G[args[keep]])
    if np.isrealobj(mels) and np.max(np.abs(chi_G.imag)) < 1e-12:
        phase = phase.real  # real characters and elements: a real symmetric matrix
    values = mels[keep] * phase * np.sqrt(size[rows[keep]] / size[cols[keep]])
    d = int(kept.sum())
    off = sp.coo_matrix((values, (new[rows[keep]], new[cols[keep]])), shape=(d, d))
    return (off + sp.diags(diag[kept])).tocsr()


def sector_basis(hilbert: Hilbert, sector: Sector, group: SpaceGroup | None = None):
    """The sector's orthonormal basis as a sparse complex [D, d] matrix on `all_states(hilbert)`
    (columns |r~> in the order of their representatives' codes; P = B B^dagger)."""
    check_fits(hilbert, sector)
    group = space_group(hilbert) if group is None else group
    flip = sector.parity is not None
    elements, chi_G = _full_characters(group, sector, flip)
    orbits = _orbits(basis_codes(hilbert), group.perm_ExN[elements], hilbert.n_sites, flip)
    return _basis(orbits, chi_G)


def sector_dimension(hilbert: Hilbert, sector: Sector, group: SpaceGroup | None = None) -> int:
    """The sector's dimension without its basis, for a space of any size: the trace of its
    projector, |G'|^-1 sum_g chi(g)* #{s : g s = s} over G' (G_k, then G_k F with a parity).

    A permutation fixes the configurations constant on each of its cycles (with n_up spins up:
    the sets of cycles whose lengths sum to n_up); a permutation times the flip, those alternating
    along each cycle (2 per cycle where every cycle is even, none otherwise)."""
    check_fits(hilbert, sector)
    group = space_group(hilbert) if group is None else group
    elements, chi_G = _full_characters(group, sector, sector.parity is not None)
    cycles = [_cycle_lengths(perm) for perm in group.perm_ExN[elements]]
    fixed = [_fixed_by_permutation(lengths, hilbert.n_up) for lengths in cycles]
    if sector.parity is not None:
        fixed += [2 ** len(lengths) if all(n % 2 == 0 for n in lengths) else 0 for lengths in cycles]
    trace = sum(np.conj(chi) * count for chi, count in zip(chi_G, fixed)) / len(chi_G)
    return int(round(float(np.real(trace))))


def _cycle_lengths(perm) -> list:
    """The lengths of the cycles of a permutation of the sites."""
    seen, lengths = np.zeros(len(perm), bool), []
    for start in range(len(perm)):
        n, site = 0, start
        while not seen[site]:
            seen[site], site, n = True, perm[site], n + 1
        if n:
            lengths.append(n)
    return lengths


def _fixed_by_permutation(lengths: list, n_up: int | None) -> int:
    """How many configurations (with `n_up` spins up, or any) are constant on every cycle."""
    if n_up is None:
        return 2 ** len(lengths)
    ways = [1] + [0] * n_up  # ways[j]: sets of the cycles seen so far with j sites in all
    for n in lengths:
        for j in range(n_up, n - 1, -1):
            ways[j] += ways[j - n]
    return ways[n_up]


def _basis(orbits: _Orbits, chi_G):
    """The orthonormal basis of the orbits' states with characters chi_G, sparse [D, d] on
    `orbits.codes_D` (columns in the order of their representatives' codes)."""
    kept, size = _kept(orbits, chi_G)
    new = np.cumsum(kept) - 1
    rows = np.nonzero(kept[orbits.rep_D])[0]
    rep = orbits.rep_D[rows]
    values = np.conj(chi_G[orbits.arg_D[rows]]) / np.sqrt(size[rep])
    return sp.csr_matrix((values, (rows, new[rep])), shape=(len(orbits.codes_D), int(kept.sum())))


def sector_matrix(hamiltonian: PauliSum, hilbert: Hilbert, sector: Sector, group: SpaceGroup | None = None):
    """H in one sector's basis, sparse [d, d] (ValueError where the sector does not fit the space
    or H lacks its symmetry)."""
    check_fits(hilbert, sector)
    group = space_group(hilbert) if group is None else group
    flip = sector.parity is not None
    check_symmetric(hamiltonian, group, flip)
    elements, chi_G = _full_characters(group, sector, flip)
    orbits = _orbits(basis_codes(hilbert), group.perm_ExN[elements], hilbert.n_sites, flip)
    return _sector_matrix(_connections(hamiltonian, orbits, hilbert.n_sites), orbits, chi_G)


def lowest_levels_in(hamiltonian: PauliSum, hilbert: Hilbert, n_levels: int, sector: Sector | None = None) -> list:
    """The `n_levels` lowest levels of H, ascending (degenerate ones repeated): in `hilbert`'s space
    (matrix-free), or in one `sector` of it (`exact.lowest_levels`)."""
    if sector is None:
        return exact.lowest_levels(exact.operator(hamiltonian, hilbert), n_levels)
    return exact.lowest_levels(sector_matrix(hamiltonian, hilbert, sector), n_levels)


def invariant_levels(hamiltonian: PauliSum, hilbert: Hilbert, n_levels: int, perm_HxN, parity: int | None = None) -> list:
    """The `n_levels` lowest levels of P H P, ascending, on the states psi with psi(s[row]) = psi(s)
    for every row of the site permutations `perm_HxN` (a group) and, with `parity` (+1 or -1),
    psi(-s) = parity psi(s): the space a model with that invariance spans, P its projector. They
    bound what K orthogonal states of that space reach (Courant-Fischer); where H commutes with the
    rows (and the flip) they are H's own levels there. Fewer levels where the space holds fewer."""
    perm_HxN = np.unique(np.asarray(perm_HxN, np.int32), axis=0)
    flip = parity is not None
    orbits = _orbits(basis_codes(hilbert), perm_HxN, hilbert.n_sites, flip)
    chi_G = np.ones(len(perm_HxN), complex)
    if flip:
        chi_G = np.concatenate([chi_G, parity * chi_G])
    if not_invariant_under(hamiltonian, perm_HxN) is None and (not flip or commutes_with_flip(hamiltonian)):
        matrix = _sector_matrix(_connections(hamiltonian, orbits, hilbert.n_sites), orbits, chi_G)
        return exact.lowest_levels(matrix, n_levels)
    # H without that symmetry: a representative's row is not the orbit's; project the full matrix
    basis = _basis(orbits, chi_G)
    matrix = basis.conj().T @ to_sparse(hamiltonian, codes_to_states(orbits.codes_D, hilbert.n_sites)) @ basis
    return exact.lowest_levels(sp.csr_matrix(matrix), n_levels)


def commutes_with_flip(hamiltonian: PauliSum) -> bool:
    """Whether H commutes with the spin flip prod_i X_i: every string has an even number of Y and Z."""
    return all((ops.count("Y") + ops.count("Z")) % 2 == 0 for _, ops, _ in hamiltonian.terms)


def check_symmetric(hamiltonian: PauliSum, group: SpaceGroup, flip: bool) -> None:
    """ValueError unless H commutes with every element of `group` (and the flip when `flip`)."""
    e = not_invariant_under(hamiltonian, group.perm_ExN)
    if e is not None:
        raise ValueError(f"the Hamiltonian does not commute with space-group element {e} {group.names[e]}: sectors "
                         f"need an H with the lattice's symmetry")
    if flip and not commutes_with_flip(hamiltonian):
        raise ValueError("the Hamiltonian does not commute with the spin flip: use parity=False")


class Spectrum(NamedTuple):
    """The lowest levels of every 1-D sector, one momentum per star.

    Attributes:
        levels: Sector -> its lowest levels, ascending ([] for an empty sector).
        dims: Sector -> the sector's dimension.
        star_sizes: Sector -> the number of momenta in its star (sectors degenerate with it).
        n_states: dimension of the space (`hilbert.n_states`).
        with_2d_irreps: {momentum: little co-group} where 2-D irreps hold states of no sector.
    """

    levels: dict
    dims: dict
    star_sizes: dict
    n_states: int
    with_2d_irreps: dict

    @property
    def uncovered_states(self) -> int:
        """States in no listed sector: those of 2-D irreps (0 when the 1-D sectors span the space)."""
        return self.n_states - sum(self.dims[s] * self.star_sizes[s] for s in self.dims)


def spectrum(hamiltonian: PauliSum, hilbert: Hilbert, n_levels: int | None = 1, parity: bool | None = None) -> Spectrum:
    """The lowest `n_levels` levels (all with None) of every 1-D sector of `hilbert`, computed once
    for the same Hamiltonian and space (`_remembered`: the result is shared, not copied).

    Args:
        hamiltonian: a Pauli sum that commutes with the lattice's space group (ValueError otherwise).
        hilbert: the lattice and its Sz sector.
        n_levels: levels per sector, or None for all.
        parity: split by spin-flip parity: None where total_sz is null or 0 and H commutes with
            the flip, True to require it, False never.
    """
    return _remembered("spectrum", (hamiltonian, hilbert, n_levels, parity),
                       lambda: _spectrum(hamiltonian, hilbert, n_levels, parity))


def _spectrum(hamiltonian: PauliSum, hilbert: Hilbert, n_levels: int | None, parity: bool | None) -> Spectrum:
    """`spectrum`, computed."""
    group = space_group(hilbert)
    if parity is None:
        parity = bool(parities(hilbert)) and commutes_with_flip(hamiltonian)
    check_symmetric(hamiltonian, group, parity)
    listed = sectors(hilbert, parity=parity, group=group)
    codes, n = basis_codes(hilbert), hilbert.n_sites
    levels, dims, stars = {}, {}, {}
    for momentum in sorted({s.momentum for s in listed}):
        at_k = [s for s in listed if s.momentum == momentum]
        elements, _ = characters(group, at_k[0])
        orbits = _orbits(codes, group.perm_ExN[elements], n, parity)
        connections = _connections(hamiltonian, orbits, n)
        for sector in at_k:
            matrix = _sector_matrix(connections, orbits, _full_characters(group, sector, parity)[1])
            levels[sector] = exact.lowest_levels(matrix, n_levels)
            dims[sector] = matrix.shape[0]
            stars[sector] = len(star(group, momentum))
    return Spectrum(levels, dims, stars, hilbert.n_states, with_2d_irreps(group))


def ground_sector(hamiltonian: PauliSum, hilbert: Hilbert, result: Spectrum | None = None, rtol: float = 1e-9):
    """(the sector holding the ground state, its energy): the sector of lowest level; None, with
    the ground energy from `exact.ground_energy`, when a 2-D irrep lies lower than every listed
    sector. Of sectors degenerate within `rtol` (relative), the first in `result.levels`' order. Computed once for the same
    arguments (`_remembered`), as `spectrum` is: `model.sector: auto` and spectrum.json share them."""
    result = spectrum(hamiltonian, hilbert) if result is None else result
    return _remembered("ground_sector", (hamiltonian, hilbert, result, rtol),
                       lambda: _ground_sector(hamiltonian, hilbert, result, rtol))


def _ground_sector(hamiltonian: PauliSum, hilbert: Hilbert, result: Spectrum, rtol: float):
    """`ground_sector`, computed."""
    filled = {s: v[0] for s, v in result.levels.items() if v}
    lowest = min(filled.values())
    # degenerate sectors differ in the last bits, which the processor decides: the first in order wins
    best = next(s for s, e in filled.items() if e <= lowest + rtol * abs(lowest))
    if result.uncovered_states:
        energy = exact.ground_energy(hamiltonian, hilbert)
        if energy < filled[best] - rtol * abs(energy):
            return None, energy
    return best, filled[best]


# The last calls of `spectrum` and `ground_sector` kept, newest last: ((name, `_content` of the
# arguments), result).
_KEPT_CALLS = 4
_calls: list = []


def _remembered(name: str, args: tuple, compute):
    """`compute()`, or the result of a kept call of `name` whose arguments had the same content
    (`_content`). The build's `model.sector: auto` and the run's spectrum.json and sector fields
    (`runner.lifecycle.sector_check`) ask for one spectrum, and so do the points of a sweep run in
    one process that share the Hamiltonian and the space: each sector is diagonalised once."""
    key = (name, _content(args))
    for i, (kept, result) in enumerate(_calls):
        if kept == key:
            _calls.append(_calls.pop(i))
            return result
    result = compute()
    _calls.append((key, result))
    del _calls[:-_KEPT_CALLS]
    return result


def _content(x):
    """What `x` holds, comparable with ==: an array as its dtype, shape and a digest of its bytes;
    a tuple (NamedTuples too: a Hamiltonian, a space, a spectrum), list or dict as its type and
    items; anything else as its type and itself."""
    if isinstance(x, np.ndarray):
        return "array", x.dtype.str, x.shape, hashlib.blake2b(np.ascontiguousarray(x).tobytes()).hexdigest()
    if isinstance(x, dict):
        return "dict", tuple((_content(k), _content(v)) for k, v in x.items())
    if isinstance(x, (tuple, list)):
        return type(x).__qualname__, tuple(_content(v) for v in x)
    return type(x).__qualname__, x


def to_json(result: Spectrum, ground=None) -> dict:
    """A JSON-able form: levels (sector name -> lowest levels), dims, star sizes, the states of
    2-D irreps left out and where they lie, and the ground sector (name or None) and energy when
    `ground` is given."""
    out = {
        "levels": {s.name: list(v) for s, v in result.levels.items()},
        "dims": {s.name: int(d) for s, d in result.dims.items()},
        "star_sizes": {s.name: int(m) for s, m in result.star_sizes.items()},
        "n_states": int(result.n_states),
        "uncovered_states": int(result.uncovered_states),
        "with_2d_irreps": {f"k=({','.join(str(m) for m in k)})": name for k, name in result.with_2d_irreps.items()},
    }
    if ground is not None:
        out["ground_sector"] = None if ground[0] is None else ground[0].name
        out["ground_energy"] = float(ground[1])
    return out
