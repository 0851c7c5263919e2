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
