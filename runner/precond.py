"""Preconditioners of the energy gradient: none, SR (parameter space), minSR (sample space).

All of them take the centred, scaled log-derivatives and local energies

    Obar_PxS = (O - <O>)^T / sqrt(N_s),   eps_S = (E_loc - <E>) / sqrt(N_s)

(parameters first: XLA's CPU matrix product is about twice as fast with the contraction on
the trailing axis of both operands) and the gradient mode, and return the update direction:

- mode "real" (real parameters): force F = 2 Re(conj(Obar) eps), metric S = Re(conj(Obar) Obar^T);
- mode "holomorphic" (complex parameters, holomorphic log psi): F = conj(Obar) eps = dE/dconj(z),
  S = conj(Obar) Obar^T.

SR returns (S + diag_shift I)^-1 F. minSR returns the same vector through the sample-space
identity (A^H A + l)^-1 A^H = A^H (A A^H + l)^-1, cheaper with more parameters than samples.
Complex Gram matrices are assembled from one real product of stacked real and imaginary
parts (about 3x faster than XLA's complex product on CPU).
"""

import functools

import jax
import jax.numpy as jnp

from runner.errors import require_choice, require_int, require_number

SOLVERS = ("cholesky", "eigh", "cg")


def _split_samples(Obar_PxS, eps_S):
    """Mode "real" with complex inputs is a real problem with twice the samples."""
    if jnp.iscomplexobj(Obar_PxS) or jnp.iscomplexobj(eps_S):
        Obar_PxS = jnp.concatenate([jnp.real(Obar_PxS), jnp.imag(Obar_PxS)], axis=1)
        eps_S = jnp.concatenate([jnp.real(eps_S), jnp.imag(eps_S)])
    return Obar_PxS, eps_S


def _hermitian_gram(A_PxS):
    """conj(A) A^T for complex A, from one real product of [Re A; Im A]."""
    n = A_PxS.shape[0]
    B = jnp.concatenate([jnp.real(A_PxS), jnp.imag(A_PxS)], axis=0)
    G = B @ B.T
    return jax.lax.complex(G[:n, :n] + G[n:, n:], G[:n, n:] - G[n:, :n])


def force(Obar_PxS, eps_S, mode):
    """The energy gradient F in the convention of `mode` (see the module docstring)."""
    if mode == "real":
        A, b = _split_samples(Obar_PxS, eps_S)
        return 2.0 * (A @ b)
    return jnp.conj(Obar_PxS) @ eps_S


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


def _shifted(M, diag_shift):
    return M + diag_shift * jnp.eye(M.shape[0], dtype=M.dtype)


def identity_update(Obar_PxS, eps_S, mode, x0=None):
    """No preconditioning: the plain gradient."""
    return force(Obar_PxS, eps_S, mode)


def _cg_solve(Obar_PxS, eps_S, mode, x0, diag_shift, tol, maxiter):
    """SR by conjugate gradients on S x = F without forming S, warm-started from x0.

    Both layouts of Obar are materialised once: each product then contracts a trailing
    axis, about 2.5x faster than letting XLA transpose inside the loop.
    """
    if mode == "real":
        A, _ = _split_samples(Obar_PxS, eps_S)
        A_SxP = jax.lax.optimization_barrier(A.T)
        matvec = lambda x: A @ (A_SxP @ x) + diag_shift * x  # noqa: E731
    else:
        A_conj = jnp.conj(Obar_PxS)
        A_SxP = jax.lax.optimization_barrier(Obar_PxS.T)
        matvec = lambda x: A_conj @ (A_SxP @ x) + diag_shift * x  # noqa: E731
    F = force(Obar_PxS, eps_S, mode)
    return jax.scipy.sparse.linalg.cg(matvec, F, x0=x0, tol=tol, maxiter=maxiter)[0]


def sr_update(Obar_PxS, eps_S, mode, x0=None, *, diag_shift, solver, tol=1e-5, maxiter=None):
    """Stochastic reconfiguration in parameter space: (S + diag_shift) x = F.

    `x0` (the previous update) warm-starts the cg solver; the dense solvers ignore it.
    """
    if solver == "cg":
        return _cg_solve(Obar_PxS, eps_S, mode, x0, diag_shift, tol, maxiter)
    if mode == "real":
        A, _ = _split_samples(Obar_PxS, eps_S)
        S = A @ A.T
    else:
        S = _hermitian_gram(Obar_PxS)
    return _solve_psd(_shifted(S, diag_shift), force(Obar_PxS, eps_S, mode), solver)


def minsr_update(Obar_PxS, eps_S, mode, x0=None, *, diag_shift, solver):
    """minSR: the SR solution computed in sample space, x = A^H (A A^H + diag_shift)^-1 b."""
    if mode == "real":
        A, b = _split_samples(Obar_PxS, eps_S)
        return 2.0 * (A @ _solve_psd(_shifted(A.T @ A, diag_shift), b, solver))
    # Sample-space matrix Obar^T conj(Obar) = conj(conj(Obar)^T Obar): a Gram of the transpose.
    T = jnp.conj(_hermitian_gram(Obar_PxS.T))
    return jnp.conj(Obar_PxS) @ _solve_psd(_shifted(T, diag_shift), eps_S, solver)


def none():
    """No preconditioner (plain gradient descent with the chosen optimizer)."""
    return identity_update


def sr(diag_shift: float = 0.01, solver: str = "cholesky", cg_tol: float = 1e-5, cg_maxiter: int = 200):
    """SR. `solver`: cholesky (dense, with an eigh fallback), eigh (dense), or cg (iterative,
    warm-started from the previous update; cheaper for many parameters), which stops at a
    relative residual `cg_tol` or after `cg_maxiter` iterations."""
    require_number("diag_shift", diag_shift, nonnegative=True)
    require_choice("solver", solver, SOLVERS)
    require_number("cg_tol", cg_tol, positive=True)
    require_int("cg_maxiter", cg_maxiter, minimum=1)
    return functools.partial(sr_update, diag_shift=float(diag_shift), solver=solver,
                             tol=float(cg_tol), maxiter=cg_maxiter)


def minsr(diag_shift: float = 0.01, solver: str = "cholesky"):
    """Sample-space SR, for more parameters than samples. `solver`: cholesky or eigh."""
    require_number("diag_shift", diag_shift, nonnegative=True)
    require_choice("solver", solver, SOLVERS[:2])
    return functools.partial(minsr_update, diag_shift=float(diag_shift), solver=solver)
