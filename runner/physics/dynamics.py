"""Exact reference dynamics: states evolved by exp(-i H t) on the full space or an Sz sector
(matrix-free), and the free-fermion transverse magnetisation of the periodic Ising chain after
a quench of its field.

Vectors are indexed like `all_states(hilbert)` (binary order), as in `runner.physics.exact`;
time is in units of 1 / (the Hamiltonian's unit), hbar = 1.
"""

import numpy as np
from scipy.sparse.linalg import LinearOperator, expm_multiply

from runner.physics import exact
from runner.physics.exact import matvec_of
from runner.physics.hilbert import Hilbert, all_states
from runner.physics.pauli import PauliSum, elements_np


def _generator(hamiltonian: PauliSum, hilbert: Hilbert):
    """(-i H as a LinearOperator, its trace): the trace (from H's diagonal) lets
    `expm_multiply` shift the spectrum without estimating it."""
    apply = matvec_of(hamiltonian, hilbert)
    d = hilbert.n_states
    operator = LinearOperator((d, d), matvec=lambda v: -1j * apply(v), rmatvec=lambda v: 1j * apply(v),
                              dtype=np.complex128)
    diag, _ = elements_np(hamiltonian, all_states(hilbert))
    return operator, -1j * float(np.sum(diag))


def evolve(hamiltonian: PauliSum, hilbert: Hilbert, psi0_D, times) -> np.ndarray:
    """exp(-i H t) psi0 at each of `times`, from psi0 at t = 0.

    Args:
        hamiltonian: H (Hermitian; Sz-conserving for a sector).
        hilbert: the space, the full one or an Sz sector.
        psi0_D: the state at t = 0 [D] (not normalised here).
        times: increasing times >= 0 [T].

    Returns:
        complex128 [T, D], one state per time (by `scipy.sparse.linalg.expm_multiply` from one
        time to the next, matrix-free).
    """
    times = np.asarray(times, float)
    if times.ndim != 1 or np.any(np.diff(times) < 0) or (times.size and times[0] < 0):
        raise ValueError(f"times must be increasing and >= 0 (got {times})")
    generator, trace = _generator(hamiltonian, hilbert)
    psi, t, out = np.asarray(psi0_D, np.complex128), 0.0, []
    for t_next in times:
        if t_next > t:
            psi = expm_multiply(generator * (t_next - t), psi, traceA=trace * (t_next - t))
            t = t_next
        out.append(psi)
    return np.stack(out) if out else np.zeros((0, len(psi)), np.complex128)


def ground_state(hamiltonian: PauliSum, hilbert: Hilbert) -> np.ndarray:
    """The normalised lowest eigenvector of H [D] (`runner.physics.exact.ground_state`);
    meaningful only when the lowest eigenvalue is not degenerate."""
    return exact.ground_state(hamiltonian, hilbert)[1]


def ising_quench_magnetisation(n_sites: int, h0: float, h1: float, times, J: float = 1.0) -> np.ndarray:
    """<X_i>(t) of the periodic chain H = -J sum Z_i Z_i+1 - h sum X_i (`hamiltonians.ising`)
    started in the ground state at h = h0 and evolved at h = h1, by free fermions [T].

    By Jordan-Wigner (X_i = 1 - 2 n_i) the ground state lies in the even-fermion-parity sector
    (even N), whose fermions are antiperiodic: momenta k = (2n - 1) pi / N, n = 1 .. N / 2, paired
    with -k. Each pair spans {|0>, c_k^+ c_-k^+ |0>}, where H acts as b . tau with
    b(h) = 2 (J sin k, 0, -(h - J cos k)) (tau^z = +1 on |0>, the direction in the xy-plane a
    phase convention). The ground state at h0 points against b(h0); under b(h1) it precesses
    at angular frequency 2 |b(h1)|, and <X_i> = (2 / N) sum_k <tau^z_k>.
    """
    if isinstance(n_sites, bool) or not isinstance(n_sites, int) or n_sites < 2 or n_sites % 2:
        raise ValueError(f"n_sites must be an even integer >= 2 (got {n_sites!r})")
    k_K = (2 * np.arange(1, n_sites // 2 + 1) - 1) * np.pi / n_sites

    def direction(h):
        x_K, z_K = J * np.sin(k_K), -(h - J * np.cos(k_K))
        size_K = np.hypot(x_K, z_K)
        return x_K / size_K, z_K / size_K, 2 * size_K

    x0, z0, _ = direction(h0)
    x1, z1, size1 = direction(h1)
    along_K = x0 * x1 + z0 * z1  # b0^ . b1^
    t_T = np.asarray(times, float)
    tau_z_TxK = -(along_K * z1 + (z0 - along_K * z1) * np.cos(2 * size1 * t_T[:, None]))
    return 2.0 / n_sites * np.sum(tau_z_TxK, axis=1)


def ising_ground_energy(n_sites: int, h: float, J: float = 1.0) -> float:
    """The ground-state energy of the periodic chain H = -J sum Z_i Z_i+1 - h sum X_i (even
    n_sites), by free fermions: -sum_k sqrt(J^2 + h^2 - 2 J h cos k) over the N antiperiodic
    momenta k = (2n - 1) pi / N of the even-parity sector (`ising_quench_magnetisation`)."""
    if isinstance(n_sites, bool) or not isinstance(n_sites, int) or n_sites < 2 or n_sites % 2:
        raise ValueError(f"n_sites must be an even integer >= 2 (got {n_sites!r})")
    k_K = (2 * np.arange(1, n_sites + 1) - 1) * np.pi / n_sites
    return float(-np.sum(np.sqrt(J**2 + h**2 - 2 * J * h * np.cos(k_K))))


def ising_quench_energy(n_sites: int, h0: float, h1: float, J: float = 1.0) -> float:
    """<H(h1)> in the ground state at h0 (conserved under H(h1)): E0(h0) + (h0 - h1) sum_i <X_i>."""
    x0 = ising_quench_magnetisation(n_sites, h0, h0, [0.0], J=J)[0]
    return ising_ground_energy(n_sites, h0, J) + (h0 - h1) * n_sites * x0


def ising_chain_couplings(hamiltonian: PauliSum) -> tuple[float, float] | None:
    """(J, h) when `hamiltonian` is exactly -J sum Z_i Z_i+1 - h sum X_i on a periodic chain of an
    even number N >= 4 of sites in this order, unrotated (J, h nonzero); None otherwise."""
    n = hamiltonian.n_sites
    if hamiltonian.rotated is not None or n < 4 or n % 2:
        return None
    ring = {tuple(sorted((i, (i + 1) % n))) for i in range(n)}
    zz = {sites: c for c, ops, sites in hamiltonian.terms if ops == "ZZ"}
    x = {sites: c for c, ops, sites in hamiltonian.terms if ops == "X"}
    if len(zz) + len(x) != len(hamiltonian.terms) or set(zz) != ring or set(x) != {(i,) for i in range(n)}:
        return None
    if len(set(zz.values())) != 1 or len(set(x.values())) != 1:
        return None
    return -next(iter(zz.values())), -next(iter(x.values()))


def uniform_x_coefficient(operator: PauliSum) -> float | None:
    """c when `operator` is exactly c sum_i X_i over every site (unrotated); None otherwise."""
    x = {sites: c for c, ops, sites in operator.terms if ops == "X"}
    if operator.rotated is not None or len(x) != len(operator.terms) or set(x) != {(i,) for i in range(operator.n_sites)}:
        return None
    return next(iter(x.values())) if len(set(x.values())) == 1 else None
