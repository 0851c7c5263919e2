"""Energies of K states from one determinant of K configurations (natural excited states).

With Psi_ij(x) = psi_i(x_j) and (H Psi)_ij(x) = (H psi_i)(x_j), the local energy matrix
M(x) = (H Psi)(x) Psi(x)^-1 has trace sum_j H_j det Psi / det Psi (the determinant's local energy
under sum_j H_j, Cramer's rule) and, where psi_1..psi_K span K eigenstates, equals C diag(E) C^-1
at every x (zero variance). The energies are the eigenvalues of M's mean over samples of
|det Psi|^2; their error bars (and the gaps', which share the samples) come from a jackknife
over the independent chains.
"""

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from models import small_linalg
from models.determinant import Determinant
from runner.core import local_energy
from runner.physics.pauli import PauliSum


def state_local_energies(ham: PauliSum, each_fn: Callable, params, sigma_N, conserve_sz: bool = False):
    """(log psi_i(sigma) [K], E_loc of every state at sigma [K]), with `each_fn(params, sigma_xN)`
    giving log psi of the K states [..., K]: one evaluation of the K states per connected
    configuration. With `conserve_sz` (a space of fixed total Sz), elements to configurations of
    another Sz are dropped: the states are not defined there."""
    sigmap_CxN, mel_C, diag = local_energy.connected(ham, sigma_N)
    l_K = each_fn(params, sigma_N)
    if ham.n_connected == 0:
        return l_K, jnp.broadcast_to(diag, l_K.shape).astype(jnp.result_type(diag, l_K))
    if conserve_sz:
        same_C = jnp.sum(sigmap_CxN.astype(jnp.int32), axis=-1) == jnp.sum(sigma_N.astype(jnp.int32))
        mel_C = jnp.where(same_C, mel_C, jnp.zeros_like(mel_C))
    ratio_KxC = jnp.exp(each_fn(params, sigmap_CxN) - l_K[None, :]).T
    return l_K, local_energy.sum_elements(diag, mel_C[None, :], ratio_KxC)


def local_matrix(ham: PauliSum, each_fn: Callable, params, x_KxN, conserve_sz: bool = False):
    """M(x) = (H Psi) Psi^-1 [K, K] at the K configurations x [K, N] of one sample (`conserve_sz`:
    as in `state_local_energies`).

    Psi is scaled row by row (state by state) before it is inverted: M_ik = e^(r_i - r_k) N_ik
    with N the matrix of the scaled rows, r_i the largest log |psi_i(x_j)| over j."""
    L_KxK, E_KxK = jax.vmap(lambda s: state_local_energies(ham, each_fn, params, s, conserve_sz))(x_KxN)
    L_KxK, E_KxK = L_KxK.T, E_KxK.T  # [state i, configuration j]
    r_K = jax.lax.stop_gradient(jnp.max(jnp.real(L_KxK), axis=-1))
    phi_KxK = jnp.exp(L_KxK - r_K[:, None])
    n_KxK = small_linalg.solve(phi_KxK.T, (phi_KxK * E_KxK).T).T
    return n_KxK * jnp.exp(r_K[:, None] - r_K[None, :])


def local_matrices(ham: PauliSum, each_fn: Callable, params, sigma_CxTxM, n_states: int, conserve_sz: bool = False):
    """M(x) [C, T, K, K] of every sample (each of K N sites; `conserve_sz` as in `state_local_energies`)."""
    x_CxTxKxN = sigma_CxTxM.reshape(*sigma_CxTxM.shape[:-1], n_states, -1)
    one = lambda x: local_matrix(ham, each_fn, params, x, conserve_sz)  # noqa: E731
    return jax.vmap(jax.vmap(one))(x_CxTxKxN)


class Levels(NamedTuple):
    """The K energies (ascending) and the gaps above the lowest, each with its error bar."""

    energies: np.ndarray  # [K]
    energy_errors: np.ndarray  # [K]; NaN with one chain
    gaps: np.ndarray  # [K-1], E_k - E_0
    gap_errors: np.ndarray  # [K-1]


def _jackknife_error(leave_one_out_CxK) -> np.ndarray:
    """The jackknife error bar [K] from the values of every leave-one-chain-out sample [C, K]."""
    n = leave_one_out_CxK.shape[0]
    return np.sqrt((n - 1) / n * np.sum((leave_one_out_CxK - leave_one_out_CxK.mean(0)) ** 2, axis=0))


def _eigenvectors(m_KxK) -> np.ndarray:
    """The eigenvectors of M as columns, ordered by ascending real eigenvalue (the levels' order)."""
    values, vectors = np.linalg.eig(m_KxK)
    return vectors[:, np.argsort(values.real)]


def _levels(m_KxK) -> np.ndarray:
    return np.sort(np.linalg.eigvals(m_KxK).real)


def levels(m_CxTxKxK, w_CxT=None, exact: bool = False) -> Levels:
    """Energies from the local matrices of samples [C, T] (weights w: a full sum's or importance
    weights; None: plain means): the eigenvalues of the mean matrix, with jackknife error bars
    over the chains (leave one chain out); zero error bars for a full sum (`exact`)."""
    m = np.asarray(m_CxTxKxK)
    n_chains = m.shape[0]
    w = np.full(m.shape[:2], 1.0) if w_CxT is None else np.asarray(w_CxT, float)
    sums_CxKxK = np.einsum("ct,ctij->cij", w, m)
    weight_C = w.sum(axis=1)
    energies = _levels(sums_CxKxK.sum(0) / weight_C.sum())
    errors = np.full(energies.shape, np.nan)
    gap_errors = np.full(energies.shape[0] - 1, np.nan)
    if exact:
        errors, gap_errors = np.zeros_like(errors), np.zeros_like(gap_errors)
    elif n_chains > 1:
        rest = np.array([_levels((sums_CxKxK.sum(0) - sums_CxKxK[c]) / (weight_C.sum() - weight_C[c]))
                         for c in range(n_chains)])
        errors = _jackknife_error(rest)
        gap_errors = _jackknife_error(rest[:, 1:] - rest[:, :1])
    return Levels(energies, errors, energies[1:] - energies[0], gap_errors)


def state_variances(m_CxTxKxK, w_CxT=None) -> np.ndarray:
    """The variance of each state's local energy [K] (ascending energies' order): with the mean
    matrix M = C diag(E) C^-1, the variance over samples of the diagonal of C^-1 M(x) C, which is
    zero where the K states span K eigenstates (M(x) the same at every x)."""
    m = np.asarray(m_CxTxKxK).reshape(-1, *np.shape(m_CxTxKxK)[-2:])
    w = np.full(m.shape[0], 1.0) if w_CxT is None else np.asarray(w_CxT, float).reshape(-1)
    w = w / w.sum()
    vectors = _eigenvectors(np.einsum("s,sij->ij", w, m))
    d_SxK = np.einsum("ij,sjk,ki->si", np.linalg.inv(vectors), m, vectors)
    mean_K = w @ d_SxK
    return w @ np.abs(d_SxK - mean_K) ** 2


def _diagonal_in_eigenbasis(h_KxK, o_KxK) -> np.ndarray:
    """diag(C^-1 O C) [K], C the eigenvectors of H ordered by ascending real eigenvalue."""
    vectors = _eigenvectors(h_KxK)
    return np.diag(np.linalg.inv(vectors) @ o_KxK @ vectors).real


def state_expectations(m_CxTxKxK, o_CxTxKxK, w_CxT=None):
    """(<O> in each state [K], jackknife errors over chains [K]; NaN with one chain), ascending
    energies' order, from the local matrices of H (m) and of an operator O (o) on the same samples.

    The mean matrices are S^-1 H and S^-1 O in the span of the K states (S their overlaps); with
    S^-1 H = C diag(E) C^-1, the eigenstate c_k has <O>_k = c_k^+ O c_k / c_k^+ S c_k = (C^-1 S^-1 O C)_kk.
    """
    m, o = np.asarray(m_CxTxKxK), np.asarray(o_CxTxKxK)
    w = np.full(m.shape[:2], 1.0) if w_CxT is None else np.asarray(w_CxT, float)
    m_C, o_C, weight_C = np.einsum("ct,ctij->cij", w, m), np.einsum("ct,ctij->cij", w, o), w.sum(axis=1)
    values = _diagonal_in_eigenbasis(m_C.sum(0), o_C.sum(0) / weight_C.sum())
    n_chains = m.shape[0]
    if n_chains < 2:
        return values, np.full(values.shape, np.nan)
    rest = np.array([_diagonal_in_eigenbasis(m_C.sum(0) - m_C[c], (o_C.sum(0) - o_C[c]) / (weight_C.sum() - weight_C[c]))
                     for c in range(n_chains)])
    return values, _jackknife_error(rest)


def eigenstate_coefficients(m_CxTxKxK, w_CxT=None) -> np.ndarray:
    """[K, K]: row k the coefficients c_kj of eigenstate k = sum_j c_kj psi_j in the span of the K
    states (ascending energies' order, that of `levels`): with the mean matrix M = C diag(E) C^-1
    (`levels`' matrix, of the same samples and weights), row k of C^-1. Each row is scaled to a
    largest |c| of 1 (a state's normalisation is free)."""
    m = np.asarray(m_CxTxKxK)
    w = np.full(m.shape[:2], 1.0) if w_CxT is None else np.asarray(w_CxT, float)
    mean = np.einsum("ct,ctij->ij", w, m) / w.sum()
    rows = np.linalg.inv(_eigenvectors(mean))
    return rows / np.max(np.abs(rows), axis=1, keepdims=True)


class Combination(Determinant):
    """One eigenstate sum_j c_j psi_j of the K states of a `Determinant` (the same parameters), a
    wavefunction of one copy's N sites: log psi = log sum_j exp(log c_j + log psi_j), complex."""

    coefficients: tuple = ()
    """c_j, K complex numbers (`eigenstate_coefficients`' row)."""

    @property
    def holomorphic(self) -> bool:
        return getattr(self.base, "holomorphic", False)

    def __call__(self, sigma_xN):
        l_xK = self.each(sigma_xN)
        c_K = jnp.asarray(self.coefficients, jnp.complex128 if l_xK.dtype == jnp.float64 or
                          l_xK.dtype == jnp.complex128 else jnp.complex64)
        a_xK = l_xK.astype(c_K.dtype) + jnp.where(c_K == 0, -jnp.inf, jnp.log(jnp.where(c_K == 0, 1, c_K)))
        r_x = jax.lax.stop_gradient(jnp.max(jnp.real(a_xK), axis=-1))
        r_x = jnp.where(jnp.isfinite(r_x), r_x, 0.0)
        return r_x + jnp.log(jnp.sum(jnp.exp(a_xK - r_x[..., None]), axis=-1))
