"""Independent dense references for tests: Hamiltonians from Kronecker products of Paulis."""

import functools
import math

import numpy as np

from runner.physics import hilbert as hb
from runner.physics import pauli

X = np.array([[0, 1], [1, 0]], dtype=complex)
Y = np.array([[0, -1j], [1j, 0]], dtype=complex)
Z = np.array([[1, 0], [0, -1]], dtype=complex)


def site_op(op, i, n):
    """op acting on site i of n; site 0 is the most significant (leftmost) factor."""
    mats = [np.eye(2)] * n
    mats[i] = op
    return functools.reduce(np.kron, mats)


def dense_ising(bonds, n, J, h):
    H = sum(-J * site_op(Z, i, n) @ site_op(Z, j, n) for i, j in bonds)
    return H + sum(-h * site_op(X, i, n) for i in range(n))


def dense_heisenberg(bonds, next_bonds, n, J, J2, sublattice=None):
    def dot(i, j):
        return sum(site_op(P, i, n) @ site_op(P, j, n) for P in (X, Y, Z))

    H = sum(J * dot(i, j) for i, j in bonds) + sum(J2 * dot(i, j) for i, j in next_bonds)
    if sublattice is not None:  # Marshall rotation U = prod_{i in B} Z_i
        U = functools.reduce(lambda a, b: a @ b, [site_op(Z, i, n) for i in range(n) if sublattice[i]], np.eye(2**n))
        H = U @ H @ U
    return H


def basis_index(states):
    """Row of the dense matrix for each +-1 configuration (+1 = up = |0>, site 0 leftmost)."""
    n = states.shape[-1]
    bits = (np.asarray(states) < 0).astype(np.int64)
    return bits @ (1 << np.arange(n - 1, -1, -1))


PAULI = {"X": X, "Y": Y, "Z": Z}


def dense_pauli(terms, n):
    """sum_t coeff_t prod_k ops_t[k] on sites_t[k] as a dense [2^n, 2^n] matrix, for terms
    (coeff, ops, sites); Paulis on a repeated site multiply in the order given."""
    H = np.zeros((2**n, 2**n), complex)
    for coeff, ops, sites in terms:
        mats = [np.eye(2, dtype=complex)] * n
        for op, site in zip(ops, sites):
            mats[site] = mats[site] @ PAULI[op]
        H += coeff * functools.reduce(np.kron, mats)
    return H


def dense_rotation(sites, n):
    """U = prod_{i in sites} Z_i as a dense matrix."""
    mats = [Z if i in set(sites) else np.eye(2) for i in range(n)]
    return functools.reduce(np.kron, mats)


def dense_psi(logpsi_D, states):
    """The full 2^n vector of amplitudes exp(log psi) given on `states` (zero elsewhere)."""
    psi = np.zeros(2 ** states.shape[-1], complex)
    psi[basis_index(states)] = np.exp(np.asarray(logpsi_D))
    return psi


def dense_phase(ham, n):
    """U = prod_i exp(-i theta_i Z_i / 2) of the rotation `ham` records, as a dense 2^n matrix."""
    theta = dict(zip(ham.rotated or (), ham.angles or (math.pi,) * len(ham.rotated or ())))
    diagonals = [np.exp(-0.5j * theta.get(i, 0.0) * np.array([1.0, -1.0])) for i in range(n)]
    return np.diag(functools.reduce(np.kron, diagonals))


def on_states(ham, lattice):
    """(`ham` as a dense matrix on the lattice's configurations, their rows in the 2^n matrices above)."""
    states = hb.all_states(lattice)
    return pauli.to_sparse(ham, states).toarray(), basis_index(states)
