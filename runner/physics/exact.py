"""Exact energies of small systems for any Pauli sum: the ground state by matrix-free Lanczos, and
the lowest levels of a space or a symmetry sector (`lowest_levels`, the one eigensolver of levels).

The full 2^N space never stores H: a flip mask is a reversal of some axes of the state
vector viewed as a [2, 2, ..., 2] tensor, so H v costs a few passes over v. An Sz sector
stores, per flip mask, the index each basis state is sent to and its element.
"""

import numpy as np
import scipy.sparse as sp
from scipy.linalg import eigh_tridiagonal
from scipy.sparse.linalg import LinearOperator, eigsh

from runner.physics.hilbert import Hilbert, all_states, states_to_codes
from runner.physics.pauli import PauliSum, conserves_sz, elements_np

AUTO_MAX_STATES = 2**20
# `exact: auto`'s limit for the spectrum by symmetry sector alone (`model.sector: auto`, the sector check): its
# sectors hold about D / |G| states each, so it reaches 24 sites at Sz = 0 (docs/physics.md).
SECTOR_AUTO_MAX_STATES = 2**22
# `lowest_levels` diagonalises a space or sector of up to this many states densely (every level at
# once, degenerate ones exactly repeated), a larger one by Lanczos (ARPACK for several levels): the one
# dense-or-sparse choice.
DENSE_MAX_STATES = 600
VECTOR_TOL = 1e-10  # `ground_state`'s eigenvector: |H y - E y| below this times |E|
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


def _sector_matvec(ham: PauliSum, hilbert: Hilbert, drop_outside: bool = False):
    """H v in an Sz sector: per flip mask, the source and target index and element. Elements that
    leave the sector raise, or are dropped with `drop_outside` (P H P, for observables)."""
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
            inside = codes[target] == codes[source] ^ mask
            if not np.all(inside) and not drop_outside:
                raise ValueError("the Hamiltonian leaves the Sz sector")
            source, target = source[inside], target[inside]
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


def _observable_matvec(op: PauliSum, hilbert: Hilbert):
    """v -> O v on the full space, P O P v in an Sz sector (P its projector): the elements of O
    that leave the sector are dropped, which is exact for a state in the sector."""
    if hilbert.total_sz is None:
        return _full_space_matvec(op, hilbert.n_sites)
    return _sector_matvec(op, hilbert, drop_outside=True)


def expectation(op: PauliSum, hilbert: Hilbert, psi_D):
    """<psi|O|psi> / <psi|psi> (real part) for any Pauli sum O, Sz-conserving or not.

    In an Sz sector psi = P psi, so <psi|O|psi> = <psi|P O P|psi>: the elements of O that leave
    the sector do not count (as in the sampled estimate), and an O that only changes Sz (sum_i X_i)
    has expectation exactly 0.

    Args:
        op: O, a Pauli sum on the sites of `hilbert` (built on the full space or not).
        hilbert: the space, the full one or an Sz sector.
        psi_D: a state on `all_states(hilbert)` [D], or a batch of them [T, D] (not normalised).

    Returns:
        a float for one state; float64 [T] for a batch (O is applied the same way to each).
    """
    psi_D = np.asarray(psi_D)
    apply = _observable_matvec(op, hilbert)
    value_T = np.array([np.real(np.vdot(psi, apply(psi))) / np.vdot(psi, psi).real
                        for psi in np.atleast_2d(psi_D)])
    return float(value_T[0]) if psi_D.ndim == 1 else value_T


def energy_of(hamiltonian: PauliSum, hilbert: Hilbert, psi_D) -> float:
    """<psi|H|psi> / <psi|psi> of a state given by its amplitudes on `all_states(hilbert)`:
    the exact variational energy, with no sampling noise (`expectation`, for an H that conserves
    Sz in a sector)."""
    if hilbert.total_sz is not None and not conserves_sz(hamiltonian):
        raise ValueError("an Sz sector needs an Sz-conserving Hamiltonian")
    return expectation(hamiltonian, hilbert, np.asarray(psi_D).reshape(-1))


def ground_energy(hamiltonian: PauliSum, hilbert: Hilbert) -> float:
    """Lowest eigenvalue of H in the (Sz-constrained) space of `hilbert`."""
    return ground_state(hamiltonian, hilbert, vector=False)[0]


def ground_state(hamiltonian: PauliSum, hilbert: Hilbert, vector: bool = True):
    """(lowest eigenvalue of H, its normalised eigenvector [D] complex128 or None) in the
    (Sz-constrained) space of `hilbert`: `lanczos` from a fixed random start, the vector (`vector`)
    by `ritz_vector` from the same run's coefficients.

    With a degenerate lowest level the vector is one of its eigenvectors: the one the fixed
    start leads to (Lanczos from one start vector sees one direction of a degenerate level).
    """
    d = hilbert.n_states
    matvec = matvec_of(hamiltonian, hilbert)
    rng = np.random.default_rng(0)
    v0 = rng.standard_normal(d)
    if not hamiltonian.is_real:
        v0 = v0 + 1j * rng.standard_normal(d)
    energy, alphas, betas = lanczos(matvec, v0, vector_tol=VECTOR_TOL if vector else None)
    return energy, ritz_vector(matvec, v0, alphas, betas) if vector else None


def operator(hamiltonian: PauliSum, hilbert: Hilbert) -> LinearOperator:
    """H on the (Sz-constrained) space of `hilbert` as a matrix-free LinearOperator [D, D]
    (`matvec_of`), for `lowest_levels`."""
    d = hilbert.n_states
    return LinearOperator((d, d), matvec=matvec_of(hamiltonian, hilbert),
                          dtype=np.float64 if hamiltonian.is_real else np.complex128)


def lowest_levels(matrix, n_levels: int | None) -> list:
    """The `n_levels` lowest eigenvalues (all with None) of a Hermitian matrix, ascending, each
    degenerate level repeated: dense up to DENSE_MAX_STATES states (or where n_levels >= d - 1),
    else from a fixed random start: the lowest level alone by plain Lanczos (`lanczos`), several
    levels by implicitly restarted Lanczos (ARPACK).

    Args:
        matrix: [d, d], a scipy sparse matrix (a symmetry sector's, `runner.physics.spectrum`) or
            a LinearOperator (a whole space's, `operator`).
        n_levels: how many levels, or None for all.

    Returns:
        list of float, min(n_levels, d) levels ([] for d = 0).
    """
    d = matrix.shape[0]
    if d == 0:
        return []
    if n_levels is None or d <= DENSE_MAX_STATES or n_levels >= d - 1:
        if sp.issparse(matrix):
            dense = matrix.toarray()
        else:
            dense = np.stack([matrix.matvec(e) for e in np.eye(d, dtype=matrix.dtype)], axis=1)
        return [float(x) for x in np.linalg.eigvalsh(dense)[:n_levels]]
    v0 = np.random.default_rng(0).standard_normal(d)  # ARPACK casts it to the matrix's dtype
    if n_levels == 1:  # one level: no restarts to pay for (docs/notes/research-sizes.md)
        return [lanczos_ground_energy(lambda v: matrix @ v, v0.astype(np.result_type(matrix.dtype, v0.dtype)))]
    return [float(x) for x in np.sort(eigsh(matrix, k=n_levels, which="SA", v0=v0, return_eigenvectors=False))]


def lanczos_ground_energy(matvec, v0, tol=1e-13, max_iter=1000) -> float:
    """Lowest eigenvalue of a Hermitian operator by plain Lanczos (`lanczos`)."""
    return lanczos(matvec, v0, tol, max_iter)[0]


def lanczos(matvec, v0, tol=1e-13, max_iter=1000, vector_tol=None):
    """Lowest eigenvalue of a Hermitian operator by plain Lanczos: three vectors, no restarts.

    Without reorthogonalisation Lanczos grows duplicate ("ghost") copies of converged
    eigenvalues, but never a spurious value below the lowest one, which converges
    monotonically from above; iteration stops when it changes by less than `tol` relative.
    With `vector_tol` it goes on (the eigenvalue returned is the one it stopped at) until the
    residual |H y - E y| of the eigenvector y `ritz_vector` builds is below vector_tol |E|.

    Returns:
        (lowest eigenvalue, alphas [m], betas [m - 1]): the tridiagonal matrix of the run.
    """
    v = v0 / np.linalg.norm(v0)
    v_prev = np.zeros_like(v)
    alphas, betas, beta, energy, found = [], [], 0.0, np.inf, None
    for _ in range(max_iter):
        w = matvec(v)
        w -= beta * v_prev
        alpha = float(np.vdot(v, w).real)
        w -= alpha * v
        alphas.append(alpha)
        lowest = float(eigh_tridiagonal(np.array(alphas), np.array(betas), eigvals_only=True,
                                        select="i", select_range=(0, 0))[0])
        beta = float(np.linalg.norm(w))
        if found is None and (abs(energy - lowest) <= tol * abs(lowest) or beta < 1e-12):
            found = lowest
        if found is not None and (vector_tol is None or beta < 1e-12
                                  or beta * abs(_lowest_vector(alphas, betas)[-1]) <= vector_tol * abs(lowest)):
            return found, np.array(alphas), np.array(betas)
        energy = lowest
        betas.append(beta)
        v_prev, v = v, w / beta
    raise RuntimeError(f"Lanczos did not converge in {max_iter} iterations")


def _lowest_vector(alphas, betas) -> np.ndarray:
    """The normalised lowest eigenvector [m] of the tridiagonal matrix (alphas, betas)."""
    return eigh_tridiagonal(np.asarray(alphas), np.asarray(betas), select="i", select_range=(0, 0))[1][:, 0]


def ritz_vector(matvec, v0, alphas, betas) -> np.ndarray:
    """The normalised eigenvector of a `lanczos` run's lowest eigenvalue (complex128 [D]): the
    recurrence run again from `v0` with the recorded coefficients (no Lanczos vector is stored),
    summed with the weights of the tridiagonal matrix's lowest eigenvector."""
    s_M = _lowest_vector(alphas, betas)
    v = v0 / np.linalg.norm(v0)
    v_prev = np.zeros_like(v)
    psi = np.zeros(len(v), np.complex128)
    for k in range(len(alphas)):
        psi += s_M[k] * v
        if k + 1 == len(alphas):
            break
        w = matvec(v) - (betas[k - 1] if k else 0.0) * v_prev - alphas[k] * v
        v_prev, v = v, w / betas[k]
    return psi / np.linalg.norm(psi)


def _wants(setting, hilbert: Hilbert, limit: int) -> bool:
    """The `exact` knob resolved: auto computes when the space has at most `limit` states."""
    return hilbert.n_states <= limit if setting == "auto" else bool(setting)


def wants_exact(setting, hilbert: Hilbert) -> bool:
    """Resolves the `exact` knob: auto computes when the space has at most 2^20 states."""
    return _wants(setting, hilbert, AUTO_MAX_STATES)


def wants_sectors(setting, hilbert: Hilbert) -> bool:
    """Resolves the `exact` knob for the spectrum by symmetry sector: auto computes it when the
    space has at most SECTOR_AUTO_MAX_STATES states."""
    return _wants(setting, hilbert, SECTOR_AUTO_MAX_STATES)


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
