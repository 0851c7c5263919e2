"""Preconditioners of the energy gradient: none, SR (parameter space), minSR (sample space).

All of them take the centred, scaled log-derivatives and local energies

    Obar_SxP = (O - <O>) / sqrt(N_s),   eps_S = (E_loc - <E>) / sqrt(N_s)

and the gradient mode, and return the update direction in parameter space:

- mode "real" (real parameters): force F = 2 Re(Obar^H eps), metric S = Re(Obar^H Obar);
- mode "holomorphic" (complex parameters, holomorphic log psi): F = Obar^H eps = dE/dconj(z),
  S = Obar^H Obar.

SR returns (S + diag_shift I)^-1 F. minSR returns the same vector through the sample-space
identity (A^H A + l)^-1 A^H = A^H (A A^H + l)^-1, which is cheaper with more parameters than
samples.
"""

import functools

import jax
import jax.numpy as jnp

from runner.errors import require_choice, require_number

SOLVERS = ("cholesky", "eigh")


def _real_rows(Obar_SxP, eps_S):
    """Stacks real and imaginary parts so that mode "real" becomes a real least-squares."""
    if jnp.iscomplexobj(Obar_SxP) or jnp.iscomplexobj(eps_S):
        Obar_SxP = jnp.concatenate([jnp.real(Obar_SxP), jnp.imag(Obar_SxP)], axis=0)
        eps_S = jnp.concatenate([jnp.real(eps_S), jnp.imag(eps_S)], axis=0)
    return Obar_SxP, eps_S


def force(Obar_SxP, eps_S, mode):
    """The energy gradient F in the convention of `mode` (see the module docstring)."""
    if mode == "real":
        A, b = _real_rows(Obar_SxP, eps_S)
        return 2.0 * (A.T @ b)
    return jnp.conj(Obar_SxP).T @ eps_S


def _solve_psd(M, rhs, solver):
    """Solves M x = rhs for Hermitian positive (semi-)definite M.

    Cholesky first; if it fails (non-finite factor), falls back to an eigendecomposition
    that drops eigenvalues below 1e-12 of the largest.
    """

    def by_eigh(_):
        w, V = jnp.linalg.eigh(M)
        cutoff = 1e-12 * jnp.max(jnp.abs(w))
        inv = jnp.where(w > cutoff, 1.0 / jnp.where(w > cutoff, w, 1.0), 0.0)
        return V @ (inv * (jnp.conj(V).T @ rhs))

    if solver == "eigh":
        return by_eigh(None)
    L = jnp.linalg.cholesky(M)
    y = jax.scipy.linalg.solve_triangular(L, rhs, lower=True)
    x = jax.scipy.linalg.solve_triangular(jnp.conj(L).T, y, lower=False)
    return jax.lax.cond(jnp.all(jnp.isfinite(x)), lambda _: x, by_eigh, None)


def identity_update(Obar_SxP, eps_S, mode):
    """No preconditioning: the plain gradient."""
    return force(Obar_SxP, eps_S, mode)


def sr_update(Obar_SxP, eps_S, mode, *, diag_shift, solver):
    """Stochastic reconfiguration in parameter space: (S + diag_shift) x = F."""
    if mode == "real":
        A, b = _real_rows(Obar_SxP, eps_S)
        S = A.T @ A
        F = 2.0 * (A.T @ b)
    else:
        A_H = jnp.conj(Obar_SxP).T
        S = A_H @ Obar_SxP
        F = A_H @ eps_S
    S = S + diag_shift * jnp.eye(S.shape[0], dtype=S.dtype)
    return _solve_psd(S, F, solver)


def minsr_update(Obar_SxP, eps_S, mode, *, diag_shift, solver):
    """minSR: the SR solution computed in sample space, x = A^H (A A^H + diag_shift)^-1 b."""
    if mode == "real":
        A, b = _real_rows(Obar_SxP, eps_S)
        T = A @ A.T
        T = T + diag_shift * jnp.eye(T.shape[0], dtype=T.dtype)
        return 2.0 * (A.T @ _solve_psd(T, b, solver))
    T = Obar_SxP @ jnp.conj(Obar_SxP).T
    T = T + diag_shift * jnp.eye(T.shape[0], dtype=T.dtype)
    return jnp.conj(Obar_SxP).T @ _solve_psd(T, eps_S, solver)


def none():
    """No preconditioner (plain gradient descent with the chosen optimizer)."""
    return identity_update


def sr(diag_shift: float = 0.01, solver: str = "cholesky"):
    """Dense SR. `solver`: cholesky (with an eigh fallback) or eigh."""
    require_number("diag_shift", diag_shift, nonnegative=True)
    require_choice("solver", solver, SOLVERS)
    return functools.partial(sr_update, diag_shift=float(diag_shift), solver=solver)


def minsr(diag_shift: float = 0.01, solver: str = "cholesky"):
    """Sample-space SR, for more parameters than samples."""
    require_number("diag_shift", diag_shift, nonnegative=True)
    require_choice("solver", solver, SOLVERS)
    return functools.partial(minsr_update, diag_shift=float(diag_shift), solver=solver)
