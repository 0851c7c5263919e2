"""The Hamiltonians of the config group `hamiltonian` (ising, xxz, heisenberg, pauli) as Pauli sums."""

import math

import numpy as np

from runner.errors import ConfigError, require_number
from runner.physics.hilbert import Hilbert
from runner.physics.pauli import PauliSum, conserves_sz, is_stoquastic, pauli_sum, rotate


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


def _finish(hilbert: Hilbert, terms, rotation=(None, None)) -> PauliSum:
    """The PauliSum of `terms` on the lattice rotated by `rotation` ((sites, angles) of
    `pauli.rotate`), refusing an Sz sector it does not conserve."""
    ham = rotate(pauli_sum(hilbert.n_sites, terms), *rotation)
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


PHASE_PRIORS = ("none", "marshall", "three_sublattice", "spiral", "auto")
# The values of `sign_rule`, the key phase_prior replaced, in today's spelling (`upgraded`).
SIGN_RULE = {True: "marshall", False: "none", None: None}


def heisenberg(
    hilbert: Hilbert, J: float = 1.0, J2: float = 0.0, phase_prior: str | None = None
) -> PauliSum:
    """Heisenberg model H = J sum_<ij> s_i.s_j + J2 sum_<<ij>> s_i.s_j with Pauli matrices s.

    Args:
        hilbert: the lattice; <<ij>> are its `next_bonds`.
        J: nearest-neighbour coupling.
        J2: next-nearest-neighbour coupling.
        phase_prior: the fixed diagonal unitary U applied (H -> U H U^dagger, same spectrum; the
            model holds U psi), `phase_rotation`'s: marshall (bipartite lattices), three_sublattice
            (the 120-degree pattern of a triangular lattice; complex elements), spiral (`spiral_angles`:
            the commensurate planar spiral of lowest classical energy), none, or None:
            marshall only where it makes H stoquastic (a bipartite lattice with J > 0 and J2 = 0,
            or J2 < 0), none elsewhere; auto: the classical order of the antiferromagnet where the
            lattice admits it (`auto_prior`).
    """
    J = require_number("J", J)
    J2 = require_number("J2", J2)
    if phase_prior is not None and phase_prior not in PHASE_PRIORS:
        raise ConfigError("phase_prior", f"must be null, {', '.join(PHASE_PRIORS)} (got {phase_prior!r})")
    if phase_prior == "auto":
        phase_prior = auto_prior(hilbert, J)
    pairs = [(J, tuple(b)) for b in hilbert.bonds] + [(J2, b) for b in _next_terms(hilbert, J2, "J2")]
    terms = [(c, ops, b) for c, b in pairs for ops in ("XX", "YY", "ZZ")]
    if phase_prior == "spiral":
        return _finish(hilbert, terms, spiral_angles(hilbert, pairs))
    if phase_prior is not None:
        return _finish(hilbert, terms, phase_rotation(hilbert, phase_prior))
    plain = _finish(hilbert, terms)
    if hilbert.sublattice is None:
        return plain
    marshall = rotate(plain, *phase_rotation(hilbert, "marshall"))
    if is_stoquastic(plain) or not is_stoquastic(marshall):
        return plain
    return marshall


def auto_prior(hilbert: Hilbert, J: float = 1.0) -> str:
    """`phase_prior: auto`'s prior: the classical order of the nearest-neighbour antiferromagnet
    (J > 0) where the lattice admits it: marshall on a bipartite lattice, three_sublattice where the
    120-degree pattern fits (a triangular lattice whose periodic extents are multiples of 3, or
    open); none elsewhere and for J <= 0."""
    if J <= 0:
        return "none"
    if hilbert.sublattice is not None:
        return "marshall"
    return "none" if hilbert.three_sublattice is None else "three_sublattice"


def phase_rotation(hilbert: Hilbert, prior: str):
    """(sites, angles) of the phase prior's U = prod_i exp(-i theta_i Z_i / 2) (`pauli.rotate`):
    marshall theta = pi on sublattice 1 (U = prod Z_i there); three_sublattice theta = 2 pi k / 3
    on sublattice k of the 120-degree pattern; none (None, None).

    Raises:
        ConfigError: the lattice has no such pattern.
    """
    if prior == "none":
        return None, None
    if prior == "marshall":
        if hilbert.sublattice is None:
            raise ConfigError("phase_prior", "marshall needs a bipartite lattice (a chain or square lattice with even "
                                             "periodic extents, a honeycomb lattice, or pbc=false)")
        return tuple(int(i) for i in np.nonzero(hilbert.sublattice)[0]), None
    if hilbert.three_sublattice is None:
        raise ConfigError("phase_prior", "three_sublattice needs a triangular lattice whose periodic extents are "
                                         "multiples of 3 (the 120-degree pattern does not fit this one)")
    k = np.asarray(hilbert.three_sublattice)
    sites = np.nonzero(k)[0]
    return tuple(int(i) for i in sites), tuple(2 * math.pi * int(k[i]) / 3 for i in sites)


def spiral_angles(hilbert: Hilbert, pairs):
    """(sites, angles) of the `spiral` prior: theta_i = q . R_i + phi_b on the cell R_i and basis site b
    of site i, with q a wave vector of the lattice's grid (q = 2 pi m_a / L_a along each direction a)
    and phi_b a multiple of pi / 3 (phi_0 = 0; these hold the collinear and 120-degree orders), chosen
    for the lowest classical energy sum_(c, ij) c cos(theta_i - theta_j) over the coupled `pairs`
    (ties: the lowest energy on the strongest couplings, as Neel over stripes at J2 = J / 2, then the
    smallest m, then the smallest phi). The rotated H keeps the translations (theta_i -
    theta_j depends on the displacement alone), so a translation-invariant model can follow it: the
    Neel order on even square tori, the 120-degree one on triangular tori with sides multiples of 3,
    the q = 0 120-degree order on kagome tori, and the nearest commensurate spiral elsewhere.

    Raises:
        ConfigError: the lattice is a graph (no unit cells).
    """
    extents = tuple(int(e) for e in hilbert.shape)
    n_cells = int(np.prod(extents))
    if hilbert.n_sites % n_cells or (hilbert.pbc and len(hilbert.translations) != n_cells):
        raise ConfigError("phase_prior", "spiral needs a lattice of unit cells (chain, square, triangular, "
                                         "honeycomb, kagome); a graph has none")
    n_basis = hilbert.n_sites // n_cells
    site = np.arange(hilbert.n_sites)
    cells = np.stack(np.unravel_index(site // n_basis, extents), axis=1)  # site (x * Ly + y) * n_basis + b
    i, j = (np.array([p[1][k] for p in pairs], dtype=int) for k in (0, 1))
    c = np.array([p[0] for p in pairs], dtype=float)
    strongest = np.isclose(np.abs(c), np.max(np.abs(c)))
    basis = site % n_basis
    best = None
    for m in np.ndindex(*extents):
        wave = 2 * math.pi * cells @ (np.asarray(m) / np.asarray(extents))
        for phi in np.ndindex(*(1,) + (6,) * (n_basis - 1)):
            theta = wave + (math.pi / 3) * np.asarray(phi)[basis]
            bond = c * np.cos(theta[i] - theta[j])
            energy = (round(float(np.sum(bond)), 9), round(float(np.sum(bond[strongest])), 9))
            if best is None or energy < best[0]:
                best = (energy, theta)
    theta = np.mod(best[1], 2 * math.pi)
    sites = np.nonzero(~np.isclose(theta, 0.0))[0]
    return tuple(int(k) for k in sites), tuple(float(theta[k]) for k in sites)


def upgraded(node):
    """A stored run's `hamiltonian` node in today's spelling: heisenberg's `sign_rule` (true,
    false, null) as `phase_prior` (marshall, none, null); any other node as it is."""
    if not (isinstance(node, dict) and "sign_rule" in node and "phase_prior" not in node):
        return node
    rule = node["sign_rule"]
    value = SIGN_RULE[rule] if rule is None or isinstance(rule, bool) else rule
    return {("phase_prior" if k == "sign_rule" else k): (value if k == "sign_rule" else v) for k, v in node.items()}


def upgraded_overrides(lines: list[str]) -> list[str]:
    """A stored run's command-line overrides in today's spelling: `hamiltonian.sign_rule=true` as
    `hamiltonian.phase_prior=marshall` (false: none, null: null)."""
    spelled = {"true": "marshall", "false": "none", "null": "null"}
    out = []
    for line in lines:
        key, _, value = line.partition("=")
        if key.lstrip("+") == "hamiltonian.sign_rule":
            line = f"{key.replace('sign_rule', 'phase_prior')}={spelled.get(value.strip().lower(), value)}"
        out.append(line)
    return out


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
