"""Exact ground-state energies of small systems (Lanczos on the sparse Hamiltonian)."""

import numpy as np
import scipy.sparse.linalg as sla

from runner.hilbert import Hilbert, all_states
from runner.operators import Hamiltonian, to_sparse

AUTO_MAX_STATES = 2**20


def ground_energy(hamiltonian: Hamiltonian, hilbert: Hilbert) -> float:
    """Lowest eigenvalue of H in the (Sz-constrained) space of `hilbert`."""
    states = all_states(hilbert)
    H = to_sparse(hamiltonian, states)
    if H.shape[0] <= 64:
        return float(np.linalg.eigvalsh(H.toarray())[0])
    v0 = np.random.default_rng(0).standard_normal(H.shape[0])
    return float(sla.eigsh(H, k=1, which="SA", v0=v0, tol=1e-12)[0][0])


def wants_exact(setting, hilbert: Hilbert) -> bool:
    """Resolves the `exact` knob: auto computes when the space has at most 2^20 states."""
    if setting == "auto":
        return hilbert.n_states <= AUTO_MAX_STATES
    return bool(setting)
