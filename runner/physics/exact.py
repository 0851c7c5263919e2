"""Exact ground-state energies of small systems: matrix-free Lanczos for any Pauli sum.

The full 2^N space never stores H: a flip mask is a reversal of some axes of the state
vector viewed as a [2, 2, ..., 2] tensor, so H v costs a few passes over v. An Sz sector
stores, per flip mask, the index each basis state is sent to and its element.
"""

import numpy as np
from scipy.linalg import eigh_tridiagonal

from runner.physics.hilbert import Hilbert, all_states, states_to_codes
from runner.physics.pauli import PauliSum, conserves_sz, elements_np

AUTO_MAX_STATES = 2**20
# Peak memory per basis state: the diagonal, the Lanczos vectors and temporaries of H v
# (complex, 16 bytes each) in the full space; a sector adds its codes and, per flip mask,
# a source index, a target index and an element.
_FULL_BYTES_PER_STATE = 8 + 8 * 16
_SECTOR_BYTES_PER_STATE_AND_MASK = 4 + 4 + 16


def required_bytes(hilbert: Hilbert) -> int:
    """Estimated peak memory of `ground_energy` on `hilbert` (bytes).

    A sector's index tables are counted for one flip mask per bond and next bond, plus the
    scan of all 2^N codes that lists the sector's states.
    """
    n_states = hilbert.n_states
    if hilbert.total_sz is None:
        return n_states * _FULL_BYTES_PER_STATE
    masks = len(hilbert.bonds) + len(hilbert.next_bonds)
    scan = 2**hilbert.n_sites * 16
    return n_states * (_FULL_BYTES_PER_STATE + 8 + masks * _SECTOR_BYTES_PER_STATE_AND_MASK) + scan


def _signs_along(n: int, sites) -> list:
    """Broadcastable +-1 factors of s_j along tensor axis j (index 0 = bit 0 = down)."""
    out = []
    for j in sites:
        shape = [1] * n
        shape[j] = 2
        out.append(np.array([-1.0, 1.0]).reshape(shape))
    return out


def _tensor_element(n: int, sign_sites_TxS, coef_T):
    """sum_t coef[t] prod_s s_{sign_sites[t, s]} as a broadcastable [2]*N-like array."""
    total = 0
    for sites, c in zip(sign_sites_TxS, coef_T):
        if c == 0:
            continue
        factor = c
        for sign in _signs_along(n, [int(s) for s in sites if s < n]):
            factor = factor * sign
        total = total + factor
    return total


def _full_space_matvec(ham: PauliSum, n: int):
    """H v on the full 2^N space (binary order), from views of v as a [2]*N tensor."""
    diag = np.asarray(_tensor_element(n, ham.diag_sites, ham.diag_coef) + np.zeros((2,) * n)).reshape(-1)
    offdiag = []
    for group in ham.groups:
        coef, const = (group.coef.real, group.const.real) if ham.is_real else (group.coef, group.const)
        for k, sites in enumerate(group.flip_sites):
            element = _tensor_element(n, group.sign_sites[k], coef[k]) + const[k]
            offdiag.append((tuple(int(s) for s in sites), element))

    def matvec(v):
        v = np.asarray(v).reshape(-1)
        out = (diag * v).astype(np.result_type(v, *(e for _, e in offdiag)) if offdiag else v.dtype)
        t_in, t_out = v.reshape((2,) * n), out.reshape((2,) * n)
        for axes, element in offdiag:
            # (H v)(sigma) += <sigma|H|sigma'> v(sigma') with sigma' = sigma flipped on `axes`.
            t_out += element * np.flip(t_in, axis=axes)
        return out

    return matvec


def _sector_matvec(ham: PauliSum, hilbert: Hilbert):
    """H v in an Sz sector: per flip mask, the source and target index and element."""
    n = hilbert.n_sites
    states = all_states(hilbert)
    codes = states_to_codes(states)  # increasing
    diag, groups = elements_np(ham, states)
    terms = []
    for group, mel_DxK in groups:
        for k, sites in enumerate(group.flip_sites):
            mask = sum(1 << (n - 1 - int(s)) for s in sites)
            source = np.nonzero(np.abs(mel_DxK[:, k]) > 0)[0]
            target = np.searchsorted(codes, codes[source] ^ mask)
            target = np.minimum(target, len(codes) - 1)
            if not np.all(codes[target] == codes[source] ^ mask):
                raise ValueError("the Hamiltonian leaves the Sz sector")
            terms.append((source.astype(np.int32), target.astype(np.int32), mel_DxK[source, k]))
    del states

    def matvec(v):
        v = np.asarray(v).reshape(-1)
        out = (diag * v).astype(np.result_type(v, *(m for _, _, m in terms)) if terms else v.dtype)
        for source, target, mel in terms:
            out[source] += mel * v[target]
        return out

    return matvec


def matvec_of(hamiltonian: PauliSum, hilbert: Hilbert):
    """v -> H v for v indexed like `all_states(hilbert)` (binary order); H any Pauli sum (one that
    conserves Sz in a sector)."""
    if hilbert.total_sz is None:
        return _full_space_matvec(hamiltonian, hilbert.n_sites)
    if not conserves_sz(hamiltonian):
        raise ValueError("an Sz sector needs an Sz-conserving Hamiltonian")
    return _sector_matvec(hamiltonian, hilbert)


def energy_of(hamiltonian: PauliSum, hilbert: Hilbert, psi_D) -> float:
    """<psi|H|psi> / <psi|psi> of a state given by its amplitudes on `all_states(hilbert)`:
    the exact variational energy, with no sampling noise."""
    psi_D = np.asarray(psi_D)
    return float(np.real(np.vdot(psi_D, matvec_of(hamiltonian, hilbert)(psi_D))) / np.vdot(psi_D, psi_D).real)


def ground_energy(hamiltonian: PauliSum, hilbert: Hilbert) -> float:
    """Lowest eigenvalue of H in the (Sz-constrained) space of `hilbert`."""
    d = hilbert.n_states
    matvec = matvec_of(hamiltonian, hilbert)
    dtype = np.float64 if hamiltonian.is_real else np.complex128
    if d <= 64:
        dense = np.stack([matvec(e) for e in np.eye(d, dtype=dtype)], axis=1)
        return float(np.linalg.eigvalsh(dense)[0])
    rng = np.random.default_rng(0)
    v0 = rng.standard_normal(d)
    if not hamiltonian.is_real:
        v0 = v0 + 1j * rng.standard_normal(d)
    return lanczos_ground_energy(matvec, v0)


def lanczos_ground_energy(matvec, v0, tol=1e-13, max_iter=1000) -> float:
    """Lowest eigenvalue of a Hermitian operator by plain Lanczos: three vectors, no restarts.

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
        alpha = float(np.vdot(v, w).real)
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


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo, or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
