"""Exact ground-state energies of small systems: matrix-free Lanczos.

The full 2^N space never stores H: a spin flip on site i is a reversal of one axis of the
state vector viewed as a [2, 2, ..., 2] tensor, so H v costs a few passes over v. An Sz
sector stores, per off-diagonal term, the index each basis state is sent to.
"""

import numpy as np
from scipy.linalg import eigh_tridiagonal

from runner.hilbert import Hilbert, all_states, states_to_codes
from runner.operators import Hamiltonian

AUTO_MAX_STATES = 2**20


def _diagonal(ham: Hamiltonian, codes: np.ndarray, n: int) -> np.ndarray:
    """sum_b c_b s_i s_j for each basis code (site 0 is the most significant bit)."""
    diag = np.zeros(len(codes))
    for (i, j), c in zip(ham.zz_bonds, ham.zz_coef):
        differ = ((codes >> (n - 1 - i)) ^ (codes >> (n - 1 - j))) & 1
        diag += c * (1.0 - 2.0 * differ)
    return diag


def _full_space_matvec(ham: Hamiltonian, n: int):
    """H v on the full 2^N space, from views of v as a [2]*N tensor."""
    codes = np.arange(2**n, dtype=np.int64)
    diag = _diagonal(ham, codes, n)
    del codes

    def matvec(v):
        v = np.asarray(v).reshape(-1)
        out = diag * v
        t_in, t_out = v.reshape((2,) * n), out.reshape((2,) * n)
        for i, c in zip(ham.x_sites, ham.x_coef):
            t_out += c * np.flip(t_in, axis=int(i))
        for (i, j), c in zip(ham.xy_bonds, ham.xy_coef):
            # Exchange maps |..0_i..1_j..> <-> |..1_i..0_j..> and annihilates parallel pairs.
            lo = [slice(None)] * n
            hi = [slice(None)] * n
            lo[i], lo[j], hi[i], hi[j] = 0, 1, 1, 0
            t_out[tuple(lo)] += c * t_in[tuple(hi)]
            t_out[tuple(hi)] += c * t_in[tuple(lo)]
        return out

    return matvec


def _sector_matvec(ham: Hamiltonian, hilbert: Hilbert):
    """H v in an Sz sector: per exchange term, the target index of every basis state."""
    n = hilbert.n_sites
    codes = np.sort(states_to_codes(all_states(hilbert)))
    diag = _diagonal(ham, codes, n)
    if len(ham.x_sites):
        raise ValueError("single spin flips do not conserve Sz")
    terms = []
    for (i, j), c in zip(ham.xy_bonds, ham.xy_coef):
        mask = (1 << (n - 1 - int(i))) | (1 << (n - 1 - int(j)))
        differ = (((codes >> (n - 1 - i)) ^ (codes >> (n - 1 - j))) & 1).astype(bool)
        source = np.nonzero(differ)[0]
        target = np.searchsorted(codes, codes[source] ^ mask)
        terms.append((c, source, target))

    def matvec(v):
        v = np.asarray(v).reshape(-1)
        out = diag * v
        for c, source, target in terms:
            out[source] += c * v[target]
        return out

    return matvec


def _matvec(hamiltonian: Hamiltonian, hilbert: Hilbert):
    """H v for v indexed like `all_states(hilbert)` (binary order)."""
    if hilbert.total_sz is None:
        return _full_space_matvec(hamiltonian, hilbert.n_sites)
    return _sector_matvec(hamiltonian, hilbert)


def energy_of(hamiltonian: Hamiltonian, hilbert: Hilbert, psi_D) -> float:
    """<psi|H|psi> / <psi|psi> of a state given by its amplitudes on `all_states(hilbert)`:
    the exact variational energy, with no sampling noise."""
    psi_D = np.asarray(psi_D)
    return float(np.real(np.vdot(psi_D, _matvec(hamiltonian, hilbert)(psi_D))) / np.vdot(psi_D, psi_D).real)


def ground_energy(hamiltonian: Hamiltonian, hilbert: Hilbert) -> float:
    """Lowest eigenvalue of H in the (Sz-constrained) space of `hilbert`."""
    d = hilbert.n_states
    matvec = _matvec(hamiltonian, hilbert)
    if d <= 64:
        dense = np.stack([matvec(e) for e in np.eye(d)], axis=1)
        return float(np.linalg.eigvalsh(dense)[0])
    return lanczos_ground_energy(matvec, np.random.default_rng(0).standard_normal(d))


def lanczos_ground_energy(matvec, v0, tol=1e-13, max_iter=1000) -> float:
    """Lowest eigenvalue by plain Lanczos: three vectors of memory, no restarts.

    Without reorthogonalisation Lanczos grows duplicate ("ghost") copies of converged
    eigenvalues, but never a spurious value below the lowest one, which converges
    monotonically from above; iteration stops when it changes by less than `tol` relative.
    """
    v = v0 / np.linalg.norm(v0)
    v_prev = np.zeros_like(v)
    alphas, betas, beta, energy = [], [], 0.0, np.inf
    for _ in range(max_iter):
        w = matvec(v)
        w -= beta * v_prev
        alpha = float(w @ v)
        w -= alpha * v
        alphas.append(alpha)
        lowest = float(eigh_tridiagonal(np.array(alphas), np.array(betas), eigvals_only=True,
                                        select="i", select_range=(0, 0))[0])
        beta = float(np.linalg.norm(w))
        if abs(energy - lowest) <= tol * abs(lowest) or beta < 1e-12:
            return lowest
        energy = lowest
        betas.append(beta)
        v_prev, v = v, w / beta
    raise RuntimeError(f"Lanczos did not converge in {max_iter} iterations")


def wants_exact(setting, hilbert: Hilbert) -> bool:
    """Resolves the `exact` knob: auto computes when the space has at most 2^20 states."""
    if setting == "auto":
        return hilbert.n_states <= AUTO_MAX_STATES
    return bool(setting)
