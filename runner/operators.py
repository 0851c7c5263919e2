"""Spin Hamiltonians and observables as Pauli sums grouped by flip mask, and their local energies.

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

import jax.numpy as jnp
import numpy as np

from runner.errors import ConfigError, require_number
from runner.hilbert import Hilbert

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
        rotated: the sites of the basis rotation U = prod Z_i applied to the user's
            operator (the Marshall rotation), or None.
    """

    n_sites: int
    terms: tuple
    diag_sites: np.ndarray
    diag_coef: np.ndarray
    groups: tuple
    rotated: tuple | None = None

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


def pauli_sum(n_sites: int, terms, rotated=None, key: str = "terms") -> PauliSum:
    """Builds a PauliSum from (coeff, ops, sites) triples: sum_t coeff_t prod_k ops_t[k]_{sites_t[k]}.

    Args:
        n_sites: number of sites N.
        terms: iterable of (coeff, ops, sites): coeff a (complex) number, ops a string over
            X, Y, Z, sites a sequence of len(ops) site indices (a repeated site multiplies
            its Paulis, e.g. X_0 Y_0 = i Z_0).
        rotated: recorded as the basis rotation already applied (see `rotate`), or None.
        key: config key named in errors.

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
    return _grouped(n_sites, tuple(canonical), None if rotated is None else tuple(sorted(rotated)))


def _grouped(n_sites: int, terms: tuple, rotated) -> PauliSum:
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
    return PauliSum(n_sites, terms, diag_sites, diag_coef, tuple(groups), rotated)


def rotate(op: PauliSum, sites) -> PauliSum:
    """U O U with U = prod_{i in sites} Z_i: each X or Y on a rotated site gets a factor -1.

    The result records the combined rotation (rotating twice by the same sites undoes it).
    """
    sites = set(int(s) for s in sites)
    terms = tuple(
        (c * (-1) ** sum(1 for s, o in zip(ss, ops) if s in sites and o in "XY"), ops, ss) for c, ops, ss in op.terms
    )
    total = sites.symmetric_difference(op.rotated or ())
    return _grouped(op.n_sites, terms, tuple(sorted(total)) if total else None)


def rotate_like(ham: PauliSum, op: PauliSum) -> PauliSum:
    """`op` (given in the user's original basis) in the basis `ham` is simulated in: U op U
    with U the rotation `ham` applied. Expectation values of the result in the model's state
    are those of `op` in the original basis."""
    return rotate(op, ham.rotated or ())


# --- exact properties, decided per flip mask over the signs the elements depend on ---------


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
    def strings(perm):
        out = {}
        for coeff, ops, sites in ham.terms:
            key = tuple(sorted((int(perm[s]), op) for op, s in zip(ops, sites)))
            out[key] = out.get(key, 0) + coeff
        return out

    base = strings(np.arange(ham.n_sites))
    for g, perm in enumerate(np.asarray(perm_GxN)):
        moved = strings(perm)
        if moved.keys() != base.keys() or any(abs(moved[k] - base[k]) > 1e-12 * max(1.0, abs(base[k])) for k in base):
            return g
    return None


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


# --- the config options --------------------------------------------------------------------


def _on_sites(hilbert: Hilbert, on, key: str, uses_next: bool):
    """The site tuples a term acts on: `sites`, `bonds`, `next_bonds` or an explicit list."""
    if on == "sites":
        return [(i,) for i in range(hilbert.n_sites)]
    if on == "bonds":
        return [tuple(b) for b in hilbert.bonds]
    if on == "next_bonds":
        if uses_next and hilbert.next_bonds_issue:
            raise ConfigError(key, f"cannot use next_bonds with a nonzero coefficient on this lattice: {hilbert.next_bonds_issue}")
        return [tuple(b) for b in hilbert.next_bonds]
    if isinstance(on, (list, tuple)) and all(isinstance(t, (list, tuple)) for t in on):
        out = []
        for t in on:
            if not all(isinstance(s, int) and not isinstance(s, bool) for s in t):
                raise ConfigError(key, f"site tuples must hold integers (got {list(t)})")
            out.append(tuple(t))
        return out
    raise ConfigError(key, f"must be sites, bonds, next_bonds or a list of site tuples (got {on!r})")


def _finish(hilbert: Hilbert, terms, rotated=None) -> PauliSum:
    """The PauliSum of `terms` on the lattice, refusing an Sz sector it does not conserve."""
    ham = pauli_sum(hilbert.n_sites, terms)
    if rotated is not None:
        ham = rotate(ham, rotated)
    if hilbert.total_sz is not None and not conserves_sz(ham):
        raise ConfigError(
            "hilbert.total_sz", "must be null for this Hamiltonian, which does not conserve Sz"
        )
    return ham


def _next_terms(hilbert: Hilbert, J2: float, key: str):
    if J2 and hilbert.next_bonds_issue:
        raise ConfigError(key, f"must be 0 on this lattice: {hilbert.next_bonds_issue}")
    return [tuple(b) for b in hilbert.next_bonds] if J2 else []


def ising(hilbert: Hilbert, J: float = 1.0, h: float = 1.0) -> PauliSum:
    """Transverse-field Ising model H = -J sum_<ij> Z_i Z_j - h sum_i X_i.

    Args:
        hilbert: the lattice (its `total_sz` must be null unless h = 0).
        J: nearest-neighbour coupling.
        h: transverse field.
    """
    J = require_number("J", J)
    h = require_number("h", h)
    terms = [(-J, "ZZ", b) for b in hilbert.bonds] + [(-h, "X", (i,)) for i in range(hilbert.n_sites)]
    return _finish(hilbert, terms)


def xxz(hilbert: Hilbert, J: float = 1.0, Delta: float = 1.0, hz: float = 0.0) -> PauliSum:
    """XXZ model H = J sum_<ij> (X_i X_j + Y_i Y_j + Delta Z_i Z_j) - hz sum_i Z_i.

    Args:
        hilbert: the lattice.
        J: exchange coupling.
        Delta: anisotropy of the ZZ part.
        hz: longitudinal field.
    """
    J = require_number("J", J)
    Delta = require_number("Delta", Delta)
    hz = require_number("hz", hz)
    terms = [(c, ops, b) for b in hilbert.bonds for c, ops in ((J, "XX"), (J, "YY"), (J * Delta, "ZZ"))]
    terms += [(-hz, "Z", (i,)) for i in range(hilbert.n_sites)]
    return _finish(hilbert, terms)


def heisenberg(
    hilbert: Hilbert, J: float = 1.0, J2: float = 0.0, sign_rule: bool | None = None
) -> PauliSum:
    """Heisenberg model H = J sum_<ij> s_i.s_j + J2 sum_<<ij>> s_i.s_j with Pauli matrices s.

    Args:
        hilbert: the lattice; <<ij>> are its `next_bonds`.
        J: nearest-neighbour coupling.
        J2: next-nearest-neighbour coupling.
        sign_rule: apply the Marshall rotation U = prod_{i in sublattice 1} Z_i (H -> U H U,
            same spectrum). None applies it only where it makes H stoquastic (a bipartite
            lattice with J > 0 and J2 = 0, or J2 < 0); true needs a bipartite lattice.
    """
    J = require_number("J", J)
    J2 = require_number("J2", J2)
    if sign_rule is not None and not isinstance(sign_rule, bool):
        raise ConfigError("sign_rule", f"must be true, false or null (got {sign_rule!r})")
    if sign_rule and hilbert.sublattice is None:
        raise ConfigError(
            "sign_rule",
            "needs a bipartite lattice (a chain or square lattice with even periodic extents, or pbc=false)",
        )
    pairs = [(J, tuple(b)) for b in hilbert.bonds] + [(J2, b) for b in _next_terms(hilbert, J2, "J2")]
    terms = [(c, ops, b) for c, b in pairs for ops in ("XX", "YY", "ZZ")]
    plain = _finish(hilbert, terms)
    if sign_rule is False or hilbert.sublattice is None:
        return plain
    marshall = rotate(plain, np.nonzero(hilbert.sublattice)[0])
    if sign_rule is None and (is_stoquastic(plain) or not is_stoquastic(marshall)):
        return plain
    return marshall


def pauli(hilbert: Hilbert, terms: list) -> PauliSum:
    """A Hamiltonian given as Pauli strings: H = sum over `terms` of coeff * ops on each site tuple.

    Args:
        hilbert: the lattice.
        terms: list of {coeff, ops, on}: coeff a number (complex as a string such as
            "0.5j"); ops a string over X, Y, Z, one letter per site of the term; on one of
            `sites`, `bonds`, `next_bonds`, or a list of site tuples. H must be Hermitian.
    """
    if not isinstance(terms, (list, tuple)) or not terms:
        raise ConfigError("terms", "must be a non-empty list of {coeff, ops, on}")
    expanded = []
    for k, term in enumerate(terms):
        key = f"terms[{k}]"
        if isinstance(term, dict) and True in term and "on" not in term:
            # YAML 1.1 (PyYAML, Hydra) reads an unquoted `on:` key as the boolean true.
            term = {("on" if name is True else name): v for name, v in term.items()}
        if not isinstance(term, dict) or set(term) != {"coeff", "ops", "on"}:
            raise ConfigError(key, f"must have exactly the keys coeff, ops, on (got {term!r})")
        coeff = _coefficient(f"{key}.coeff", term["coeff"])
        ops = term["ops"]
        if not isinstance(ops, str) or not ops or set(ops) - set("XYZ"):
            raise ConfigError(f"{key}.ops", f"must be a non-empty string over X, Y, Z (got {ops!r})")
        for sites in _on_sites(hilbert, term["on"], f"{key}.on", uses_next=coeff != 0):
            if len(sites) != len(ops):
                raise ConfigError(f"{key}.on", f"gives {len(sites)}-site tuples but ops {ops!r} has {len(ops)} letters")
            if any(not 0 <= s < hilbert.n_sites for s in sites):
                raise ConfigError(f"{key}.on", f"site {list(sites)} is outside 0..{hilbert.n_sites - 1}")
            expanded.append((coeff, ops, sites))
    return _finish(hilbert, expanded)


def _coefficient(key, value) -> complex:
    if isinstance(value, str):
        try:
            value = complex(value.replace(" ", ""))
        except ValueError:
            raise ConfigError(key, f"must be a number such as 1.5 or '0.5j' (got {value!r})") from None
    if isinstance(value, bool) or not isinstance(value, (int, float, complex)) or not math.isfinite(abs(value)):
        raise ConfigError(key, f"must be a finite number such as 1.5 or '0.5j' (got {value!r})")
    return complex(value)


# --- evaluation ------------------------------------------------------------------------------


def _sign_products(sigma_N, sites_xS: np.ndarray, dtype):
    """prod_s sigma_ext[sites[..., s]] as `dtype` [...], with sigma_ext = (sigma, +1): one
    gather per column (no padded read when no index is the padding N)."""
    n = sigma_N.shape[-1]
    source = sigma_N if not np.any(sites_xS == n) else jnp.concatenate([sigma_N, jnp.ones((1,), sigma_N.dtype)])
    product = source[sites_xS[..., 0]]
    for s in range(1, sites_xS.shape[-1]):
        product = product * source[sites_xS[..., s]]
    return product.astype(dtype)


def _elements(ham: PauliSum, sigma_N):
    """(mel_K, diag): <sigma|H|sigma'_k> in the order of the masks, and <sigma|H|sigma>."""
    real = _real_dtype()
    dtype = real if ham.is_real else jnp.result_type(complex)
    if len(ham.diag_coef) and ham.diag_sites.shape[-1]:
        diag = _sign_products(sigma_N, ham.diag_sites, real) @ jnp.asarray(ham.diag_coef, real)
    else:
        diag = jnp.asarray(ham.diag_coef.sum(), real)  # the identity's coefficient, or 0
    mels = []
    for group in ham.groups:
        coef_KxT, const_K = (group.coef.real, group.const.real) if ham.is_real else (group.coef, group.const)
        mel = jnp.asarray(const_K, dtype)
        if group.sign_sites.shape[1] and group.sign_sites.shape[2]:
            signs_KxT = _sign_products(sigma_N, group.sign_sites, real)
            signed = jnp.sum(signs_KxT * jnp.asarray(coef_KxT, dtype), axis=-1)
            mel = signed if not np.any(const_K) else mel + signed
        mels.append(mel)
    mel_K = jnp.concatenate(mels) if mels else jnp.zeros((0,), dtype)
    return mel_K, diag


def _real_dtype():
    """The default float dtype (float64 under x64), used for matrix elements."""
    return jnp.result_type(float)


def flip_masks(ham: PauliSum) -> np.ndarray:
    """Sign masks [K, N]: connected configuration k is sigma * mask[k] (-1 where spins flip)."""
    masks = np.ones((ham.n_connected, ham.n_sites), np.int8)
    start = 0
    for group in ham.groups:
        k = np.arange(len(group.flip_sites))
        masks[start + k[:, None], group.flip_sites] = -1
        start += len(k)
    return masks


def connected(ham: PauliSum, sigma_N):
    """Connected configurations and matrix elements of one configuration.

    Args:
        ham: the Hamiltonian.
        sigma_N: spins [N] (+-1).

    Returns:
        (sigmap_KxN, mel_K, diag): the configuration under each flip mask, the elements
        <sigma|H|sigma'_k> (zero where the mask's terms annihilate sigma; complex when a
        string has an odd number of Y), and <sigma|H|sigma>.
    """
    sigmap_KxN = sigma_N[None, :] * jnp.asarray(flip_masks(ham), sigma_N.dtype)
    mel_K, diag = _elements(ham, sigma_N)
    return sigmap_KxN, mel_K, diag


def connected_moves(ham: PauliSum, sigma_N):
    """The connected configurations as moves, in the order of `connected`'s elements: a list
    of (sites_KxJ, delta_KxJ) groups, the K moves of a group each flipping J spins (groups by
    increasing J), delta = new - old = +-2."""
    return [
        (jnp.asarray(g.flip_sites, jnp.int32), -2 * sigma_N[g.flip_sites]) for g in ham.groups
    ]


def local_energy(ham: PauliSum, logpsi_fn, params, sigma_N, ratio_fn=None):
    """E_loc(s) = sum_s' <s|H|s'> psi(s') / psi(s) for one configuration.

    A zero element never multiplies its ratio, so a ratio that overflows (inf, or NaN from
    inf - inf) on a configuration H does not reach leaves E_loc finite.

    Args:
        ham: the Hamiltonian (any PauliSum).
        logpsi_fn: (params, sigma_xN) -> log psi [...], batched over leading axes.
        params: model parameters.
        sigma_N: spins [N].
        ratio_fn: optional (params, sigma_N, sites_KxJ, delta_KxJ) -> psi(s'_k) / psi(s) for
            each group of moves of `connected_moves`, for models that update cheaply.

    Returns:
        A scalar, complex when log psi or an element is complex.
    """
    mel_K, diag = _elements(ham, sigma_N)
    if ham.n_connected == 0:
        return diag
    if ratio_fn is None:
        sigmap_KxN = sigma_N[None, :] * jnp.asarray(flip_masks(ham), sigma_N.dtype)
        ratio_K = jnp.exp(logpsi_fn(params, sigmap_KxN) - logpsi_fn(params, sigma_N))
    else:
        ratio_K = jnp.concatenate([ratio_fn(params, sigma_N, *move) for move in connected_moves(ham, sigma_N)])
    return sum_elements(diag, mel_K, ratio_K)


def sum_elements(diag_x, mel_xK, ratio_xK):
    """E_loc [...] = diag + sum_k mel_k ratio_k, a zero element never multiplying its ratio (an
    overflowing ratio on a configuration H does not reach stays out of E_loc)."""
    terms_xK = mel_xK * ratio_xK
    return diag_x + jnp.sum(jnp.where(mel_xK != 0, terms_xK, jnp.zeros_like(terms_xK)), axis=-1)


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

    from runner.hilbert import states_to_codes

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
