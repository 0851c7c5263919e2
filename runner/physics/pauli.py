"""Pauli sums grouped by flip mask: construction, rotation, symmetry and stoquasticity checks, NumPy elements.

Spin Hamiltonians and observables as Pauli sums grouped by flip mask, and their local energies.

A Pauli sum is O = sum_t c_t P_t with P_t a product of X, Y, Z on distinct sites. P_t maps a
configuration sigma (s_j = +1 up, -1 down) to the one with the spins of its X and Y sites
flipped (its flip mask), with the element

    <sigma'|P_t|sigma> = i^{#Y} prod_{j carrying Z or Y} s_j          (Y|s> = i s |-s>).

Terms that share a flip mask are combined into one connected configuration, so X X + Y Y on a
parallel pair has element 0. By hermiticity the local energy uses
<sigma|O|sigma'> = conj(<sigma'|O|sigma>), a function of the signs of sigma, which is what the
stored coefficients give directly (see `FlipGroup`).
"""

import itertools
import math
from typing import NamedTuple

import numpy as np

from runner.errors import ConfigError

# Products of single-site Paulis: a b = phase * c.
_PRODUCT = {
    ("X", "X"): (1, ""), ("Y", "Y"): (1, ""), ("Z", "Z"): (1, ""),
    ("X", "Y"): (1j, "Z"), ("Y", "Z"): (1j, "X"), ("Z", "X"): (1j, "Y"),
    ("Y", "X"): (-1j, "Z"), ("Z", "Y"): (-1j, "X"), ("X", "Z"): (-1j, "Y"),
}

# Largest number of sites one flip mask's elements may depend on for the exact checks.
_MAX_CHECK_SITES = 20


class FlipGroup(NamedTuple):
    """The off-diagonal terms of the K flip masks that flip J sites each.

    For configuration sigma and mask k, sigma'_k = sigma with `flip_sites[k]` flipped and

        <sigma|O|sigma'_k> = const[k] + sum_t coef[k, t] prod_s sigma_ext[sign_sites[k, t, s]]

    with sigma_ext = (sigma, +1): the padding index N reads +1 (padded terms have coef 0).
    A term's coefficient is conj(c_t i^{#Y}) = c_t (-i)^{#Y} for real c_t; the terms without
    Z or Y (no sign to read) are summed into `const`.
    """

    flip_sites: np.ndarray  # int32 [K, J]
    sign_sites: np.ndarray  # int32 [K, T, S]
    coef: np.ndarray  # complex128 [K, T]
    const: np.ndarray  # complex128 [K]


class PauliSum(NamedTuple):
    """A Hermitian sum of Pauli strings on `n_sites` spins, grouped by flip mask.

    Attributes:
        n_sites: number of sites N.
        terms: the canonical strings ((coeff, ops, sites), ...): real coefficients, sites
            increasing, identical strings combined, zeros dropped.
        diag_sites: int32 [T, S], Z sites of the diagonal strings, padded with N.
        diag_coef: float64 [T].
        groups: FlipGroup per number of flipped sites J, increasing J; masks sorted.
        rotated: the sites of the basis rotation U = prod_i exp(-i theta_i Z_i / 2) applied to
            the user's operator (O -> U O U^dagger), or None.
        angles: theta_i of each site of `rotated`, in (0, 2 pi); None when every one is pi
            (U = prod Z_i up to a phase: the Marshall rotation).
    """

    n_sites: int
    terms: tuple
    diag_sites: np.ndarray
    diag_coef: np.ndarray
    groups: tuple
    rotated: tuple | None = None
    angles: tuple | None = None

    @property
    def n_connected(self) -> int:
        """Number of flip masks, i.e. connected configurations per configuration."""
        return sum(len(g.flip_sites) for g in self.groups)

    @property
    def is_real(self) -> bool:
        """True when every element <sigma|O|sigma'> is real (no string with an odd number of Y)."""
        return all(not np.any(g.coef.imag) and not np.any(g.const.imag) for g in self.groups)


Hamiltonian = PauliSum


def _canonical(coeff, ops: str, sites) -> tuple[complex, tuple]:
    """(phase * coeff, ((site, op), ...)) with sites increasing, repeated sites multiplied out."""
    per_site = {}
    phase = complex(coeff)
    for op, site in zip(ops, sites):
        if site in per_site:
            factor, product = _PRODUCT[(per_site[site], op)]
            phase *= factor
            if product:
                per_site[site] = product
            else:
                del per_site[site]
        else:
            per_site[site] = op
    return phase, tuple(sorted(per_site.items()))


def pauli_sum(n_sites: int, terms, rotated=None, key: str = "terms", angles=None) -> PauliSum:
    """Builds a PauliSum from (coeff, ops, sites) triples: sum_t coeff_t prod_k ops_t[k]_{sites_t[k]}.

    Args:
        n_sites: number of sites N.
        terms: iterable of (coeff, ops, sites): coeff a (complex) number, ops a string over
            X, Y, Z, sites a sequence of len(ops) site indices (a repeated site multiplies
            its Paulis, e.g. X_0 Y_0 = i Z_0).
        rotated: recorded as the basis rotation already applied (see `rotate`), or None.
        key: config key named in errors.
        angles: the rotation's angle on each site of `rotated` (None: pi on each).

    Returns:
        The PauliSum. Raises ConfigError when the sum is not Hermitian (a complex coefficient
        left after combining identical strings) or a term is malformed.
    """
    combined = {}
    for ops, sites, coeff in ((t[1], tuple(int(s) for s in t[2]), t[0]) for t in terms):
        if not isinstance(ops, str) or not ops or set(ops) - set("XYZ"):
            raise ConfigError(key, f"ops must be a non-empty string over X, Y, Z (got {ops!r})")
        if len(ops) != len(sites):
            raise ConfigError(key, f"ops {ops!r} needs {len(ops)} sites per term (got {sites})")
        if any(not 0 <= s < n_sites for s in sites):
            raise ConfigError(key, f"sites {sites} must lie in 0..{n_sites - 1}")
        phase, string = _canonical(coeff, ops, sites)
        combined[string] = combined.get(string, 0) + phase
    canonical = []
    for string, c in sorted(combined.items()):
        if abs(c) <= 1e-14:
            continue
        if abs(c.imag) > 1e-12 * max(1.0, abs(c)):
            name = "".join(f"{op}{s}" for s, op in string) or "the identity"
            raise ConfigError(
                key, f"must make a Hermitian operator, but {name} has coefficient {c} after combining identical strings"
            )
        canonical.append((float(c.real), "".join(op for _, op in string), tuple(s for s, _ in string)))
    return _grouped(n_sites, tuple(canonical), *_rotation(rotated, angles))


def _grouped(n_sites: int, terms: tuple, rotated, angles=None) -> PauliSum:
    diag, by_mask = [], {}
    for c, ops, sites in terms:
        flip = tuple(s for s, op in zip(sites, ops) if op in "XY")
        sign = tuple(s for s, op in zip(sites, ops) if op in "YZ")
        if not flip:
            diag.append((c, sign))
        else:
            by_mask.setdefault(flip, []).append((c * (-1j) ** ops.count("Y"), sign))
    S = max([len(s) for _, s in diag], default=0)
    diag_sites = np.full((len(diag), S), n_sites, np.int32)
    for t, (_, sign) in enumerate(diag):
        diag_sites[t, : len(sign)] = sign
    diag_coef = np.array([c for c, _ in diag], np.float64)
    groups = []
    for J in sorted({len(m) for m in by_mask}):
        masks = sorted(m for m in by_mask if len(m) == J)
        signed = {m: [(c, sign) for c, sign in by_mask[m] if sign] for m in masks}
        T = max(len(signed[m]) for m in masks)
        S = max([len(s) for m in masks for _, s in signed[m]], default=0)
        sign_sites = np.full((len(masks), T, S), n_sites, np.int32)
        coef = np.zeros((len(masks), T), np.complex128)
        const = np.array([sum(c for c, sign in by_mask[m] if not sign) for m in masks], np.complex128)
        for k, m in enumerate(masks):
            for t, (c, sign) in enumerate(signed[m]):
                sign_sites[k, t, : len(sign)] = sign
                coef[k, t] = c
        groups.append(FlipGroup(np.array(masks, np.int32).reshape(-1, J), sign_sites, coef, const))
    return PauliSum(n_sites, terms, diag_sites, diag_coef, tuple(groups), rotated, angles)


def _rotation(sites, angles) -> tuple:
    """(rotated, angles) as `PauliSum` records them: sites sorted with their angles reduced to
    [0, 2 pi), zero angles dropped, angles None when every one is pi; (None, None) for none."""
    if sites is None:
        return None, None
    sites = [int(s) for s in sites]
    angles = [math.pi] * len(sites) if angles is None else [float(a) for a in angles]
    if len(angles) != len(sites):
        raise ValueError(f"{len(angles)} rotation angles for {len(sites)} sites")
    kept = sorted((s, a) for s, a in zip(sites, (_reduced(a) for a in angles)) if a)
    if not kept:
        return None, None
    out = tuple(a for _, a in kept)
    return tuple(s for s, _ in kept), None if all(a == math.pi for a in out) else out


def _reduced(angle: float) -> float:
    """The angle in [0, 2 pi), with multiples of pi / 2 (and near ones) exact."""
    angle = angle % (2 * math.pi)
    quarter = round(angle / (math.pi / 2))
    if abs(angle - quarter * math.pi / 2) < 1e-12:
        return (quarter % 4) * math.pi / 2
    return angle


def _cos_sin(angle: float) -> tuple[float, float]:
    """cos and sin, exact at multiples of pi / 2."""
    exact = {0.0: (1.0, 0.0), math.pi / 2: (0.0, 1.0), math.pi: (-1.0, 0.0), 3 * math.pi / 2: (0.0, -1.0)}
    return exact.get(angle, (math.cos(angle), math.sin(angle)))


def _rotated_term(coeff: float, ops: str, sites: tuple, angle_of: dict) -> list:
    """U P U^dagger for one string, U = prod exp(-i theta_i Z_i / 2): X -> cos X + sin Y and
    Y -> cos Y - sin X on each rotated site, expanded into strings [(coeff, ops, sites)]."""
    out = [(coeff, "")]
    for op, site in zip(ops, sites):
        if op == "Z" or site not in angle_of:
            out = [(c, o + op) for c, o in out]
            continue
        cos, sin = _cos_sin(angle_of[site])
        images = ((cos, "X"), (sin, "Y")) if op == "X" else ((cos, "Y"), (-sin, "X"))
        out = [(c * f, o + p) for c, o in out for f, p in images if f]
    return [(c, o, sites) for c, o in out]


def rotate(op: PauliSum, sites, angles=None) -> PauliSum:
    """U O U^dagger with U = prod_{i in sites} exp(-i theta_i Z_i / 2), theta_i = angles[k] (pi on
    every site when None: U = prod Z_i up to a phase, each X or Y on a site gets a factor -1).

    The result records the combined rotation (its angles add: rotating twice by pi undoes it).
    """
    new_sites, new_angles = _rotation(sites, angles)
    if new_sites is None:
        return op
    angle_of = dict(zip(new_sites, new_angles or (math.pi,) * len(new_sites)))
    combined = {}
    for c, ops, ss in op.terms:
        for coeff, o, s in _rotated_term(c, ops, ss, angle_of):
            string = tuple(zip(s, o))
            combined[string] = combined.get(string, 0.0) + coeff
    terms = tuple((c, "".join(o for _, o in string), tuple(s for s, _ in string))
                  for string, c in sorted(combined.items()) if abs(c) > 1e-14)
    total = dict(zip(op.rotated or (), op.angles or (math.pi,) * len(op.rotated or ())))
    for site, angle in angle_of.items():
        total[site] = total.get(site, 0.0) + angle
    return _grouped(op.n_sites, terms, *_rotation(tuple(total), tuple(total.values())))


def rotate_like(ham: PauliSum, op: PauliSum) -> PauliSum:
    """`op` (given in the user's original basis) in the basis `ham` is simulated in: U op U^dagger
    with U the rotation `ham` applied. Expectation values of the result in the model's state
    are those of `op` in the original basis."""
    return rotate(op, ham.rotated, ham.angles)


def _sign_patterns(group: FlipGroup, k: int, n_sites: int, with_flips: bool):
    """(sigma [A, N], elements [A]) of mask k on every sign pattern of the sites they depend on."""
    sites = {int(s) for s in group.sign_sites[k].ravel() if s < n_sites}
    if with_flips:
        sites |= {int(s) for s in group.flip_sites[k]}
    sites = sorted(sites)
    if len(sites) > _MAX_CHECK_SITES:
        raise ValueError(f"a flip mask depends on {len(sites)} sites, more than the exact checks enumerate")
    patterns = np.array(list(itertools.product((1, -1), repeat=len(sites))), np.int8).reshape(2 ** len(sites), -1)
    sigma = np.ones((len(patterns), n_sites + 1), np.int8)
    sigma[:, sites] = patterns
    elements = _np_signs(group.sign_sites[k], sigma) @ group.coef[k] + group.const[k]
    return sigma[:, :n_sites], elements


def _np_signs(sign_sites_TxS, sigma_ext_AxN1):
    """prod_s sigma_ext[sign_sites[t, s]] for each row: [A, T]."""
    return np.prod(sigma_ext_AxN1[:, sign_sites_TxS], axis=-1).astype(np.float64)


def not_invariant_under(ham: PauliSum, perm_GxN) -> int | None:
    """The first row g of the site permutations perm_GxN (site i -> perm[g, i]) that does not map
    the operator's strings onto themselves with the same coefficients, None when every row does
    (H commutes with the whole group)."""
    failing = np.nonzero(~commutes_with(ham, perm_GxN))[0]
    return int(failing[0]) if len(failing) else None


def commutes_with(ham: PauliSum, perm_GxN) -> np.ndarray:
    """bool [G]: whether each row of the site permutations perm_GxN maps the operator's strings
    onto themselves with the same coefficients (U(g) H U(g)^dagger = H)."""
    def strings(perm):
        out = {}
        for coeff, ops, sites in ham.terms:
            key = tuple(sorted((int(perm[s]), op) for op, s in zip(ops, sites)))
            out[key] = out.get(key, 0) + coeff
        return out

    base = strings(np.arange(ham.n_sites))
    kept = []
    for perm in np.asarray(perm_GxN):
        moved = strings(perm)
        kept.append(moved.keys() == base.keys()
                    and all(abs(moved[k] - base[k]) <= 1e-12 * max(1.0, abs(base[k])) for k in base))
    return np.asarray(kept, bool)


def is_stoquastic(ham: PauliSum, tol: float = 1e-12) -> bool:
    """Every off-diagonal element <sigma'|H|sigma> is real and <= 0, for every configuration."""
    for group in ham.groups:
        for k in range(len(group.flip_sites)):
            _, elements = _sign_patterns(group, k, ham.n_sites, with_flips=False)
            if np.any(np.abs(elements.imag) > tol) or np.any(elements.real > tol):
                return False
    return True


def conserves_sz(ham: PauliSum, tol: float = 1e-12) -> bool:
    """True when H commutes with sum_i Z_i: every element that changes the magnetisation is 0."""
    for group in ham.groups:
        for k in range(len(group.flip_sites)):
            sigma, elements = _sign_patterns(group, k, ham.n_sites, with_flips=True)
            change = sigma[:, group.flip_sites[k]].sum(axis=1)
            if np.any(np.abs(elements[change != 0]) > tol):
                return False
    return True


def elements_np(ham: PauliSum, states_DxN: np.ndarray):
    """NumPy elements on a batch of configurations: (diag [D], [(group, mel_DxK), ...]) with
    mel_DxK[d, k] = <states[d]|H|states[d] flipped by mask k of that group>."""
    states = np.asarray(states_DxN, np.int8)
    ext = np.concatenate([states, np.ones((len(states), 1), np.int8)], axis=1)
    diag = _np_signs(ham.diag_sites, ext) @ ham.diag_coef if len(ham.diag_coef) else np.zeros(len(states))
    out = []
    for group in ham.groups:
        coef, const = (group.coef.real, group.const.real) if ham.is_real else (group.coef, group.const)
        signs = np.prod(ext[:, group.sign_sites], axis=-1).astype(np.float64)  # [D, K, T]
        out.append((group, np.einsum("dkt,kt->dk", signs, coef) + const))
    return diag, out


def to_sparse(ham: PauliSum, states: np.ndarray):
    """The operator as a scipy CSR matrix on the basis `states` [D, N] (int8 +-1).

    Connected configurations outside the basis must have zero element (true for an
    Sz-conserving operator within an Sz sector).
    """
    import scipy.sparse as sp

    from runner.physics.hilbert import states_to_codes

    states = np.asarray(states, np.int8)
    d, n = states.shape
    codes = states_to_codes(states)
    order = np.argsort(codes)
    sorted_codes = codes[order]
    diag, groups = elements_np(ham, states)
    rows, cols, vals = [np.arange(d)], [np.arange(d)], [diag.astype(complex)]
    for group, mel_DxK in groups:
        for k, sites in enumerate(group.flip_sites):
            keep = np.abs(mel_DxK[:, k]) > 0
            flipped = states[keep].copy()
            flipped[:, sites] *= -1
            target = states_to_codes(flipped)
            pos = np.minimum(np.searchsorted(sorted_codes, target), d - 1)
            if not np.all(sorted_codes[pos] == target):
                raise ValueError("connected configuration outside the basis")
            rows.append(np.nonzero(keep)[0])
            cols.append(order[pos])
            vals.append(mel_DxK[keep, k])
    values = np.concatenate(vals)
    if ham.is_real:
        values = values.real
    return sp.csr_matrix((values, (np.concatenate(rows), np.concatenate(cols))), shape=(d, d))
