"""Preconditioners of the energy gradient: none, SR (parameter space), minSR (sample space).

All of them take the centred, scaled log-derivatives and local energies

    Obar_PxS = (O - <O>)^T / sqrt(N_s),   eps_S = (E_loc - <E>) / sqrt(N_s)

as a `Jacobian` (the dense matrix on demand, parameters first: XLA's CPU matrix product is
about twice as fast with the contraction on the trailing axis of both operands; or products
with vectors, O never formed) and the gradient mode, and return the update direction:

- mode "real" (real parameters): gradient F = 2 Re(conj(Obar) eps) = dE/dtheta, metric
  S = Re(conj(Obar) Obar^T);
- mode "holomorphic" (complex parameters, holomorphic log psi): F = 2 conj(Obar) eps =
  dE/dx + i dE/dy for z = x + i y (twice dE/dconj(z)), S = conj(Obar) Obar^T.

The complex convention is NetKet's (3.23, `force_to_grad`): a complex parameter moves exactly
as the pair of real parameters (x, y) would, so learning rates mean the same for both.

SR returns (S + diag_shift I)^-1 F. minSR returns the same vector through the sample-space
identity (A^H A + l)^-1 A^H = A^H (A A^H + l)^-1, cheaper with more parameters than samples.
Complex Gram matrices are assembled from one real product of stacked real and imaginary
parts (about 3x faster than XLA's complex product on CPU).
"""

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from runner.errors import require_choice, require_int, require_number

SOLVERS = ("auto", "cholesky", "eigh", "cg")
# solver "auto": dense Cholesky up to this many parameters, conjugate gradients above. Dense
# costs N_s P^2 (the Gram matrix) + P^3/3; CG about 100 iterations of 4 N_s P without forming
# O. Measured whole VMC steps (2-core CPU): P = 440 real, 1024 samples: dense 7.7 ms, CG
# 11.0 ms; P = 560 complex, 1024 samples: dense 33 ms, CG 26 ms; P = 1368 real, 2048
# samples: dense 104 ms, CG 37 ms.
AUTO_DENSE_MAX_PARAMS = 500


class Jacobian(NamedTuple):
    """Obar (see the module docstring) of one batch of samples.

    dense: () -> Obar_PxS, materialised (only when a preconditioner calls it);
    matvec: v_P -> Obar v; rmatvec: w -> Obar^H w, without forming Obar. In mode "real" with
        a complex log psi both act on real sample vectors (Re; Im) of length 2 N_s;
    to_samples: eps_S -> eps in the coordinates of matvec's output.
    """

    dense: Callable
    matvec: Callable
    rmatvec: Callable
    to_samples: Callable


def from_products(dense, apply, apply_T, out_dtype, n_samples, mode) -> Jacobian:
    """A Jacobian from a linear map v_P -> Obar v [N_s] (`apply`, of dtype `out_dtype`) and its
    linear transpose w -> Obar^T w (`apply_T`, no conjugation), in the conventions of `mode`."""
    if mode == "holomorphic":
        # Obar^H w = conj(Obar^T conj(w)).
        return Jacobian(dense, apply, lambda w: jnp.conj(apply_T(jnp.conj(w))), lambda e: e)
    if not jnp.issubdtype(out_dtype, jnp.complexfloating):
        return Jacobian(dense, apply, lambda w: jnp.real(apply_T(w)), jnp.real)
    # Real parameters, complex log psi: samples in real coordinates (Re; Im). For real v,
    # Re(Obar^T (w_re - i w_im)) = Re(Obar)^T w_re + Im(Obar)^T w_im.
    stack = lambda y: jnp.concatenate([jnp.real(y), jnp.imag(y)])  # noqa: E731
    return Jacobian(
        dense,
        lambda v: stack(apply(v)),
        lambda w: jnp.real(apply_T((w[:n_samples] - 1j * w[n_samples:]).astype(out_dtype))),
        lambda e: stack(e.astype(out_dtype)),
    )


def from_dense(Obar_PxS, mode) -> Jacobian:
    """A Jacobian whose products use the given dense matrix (conventions as `Jacobian`)."""
    return from_products(lambda: Obar_PxS, lambda v: Obar_PxS.T @ v, lambda w: Obar_PxS @ w,
                         Obar_PxS.dtype, Obar_PxS.shape[1], mode)


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


def force(jac: Jacobian, eps_S, mode):
    """The energy gradient F in the convention of `mode` (see the module docstring)."""
    return 2.0 * jac.rmatvec(jac.to_samples(eps_S))


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


def identity_update(jac: Jacobian, eps_S, mode, x0=None):
    """No preconditioning: the plain gradient."""
    return force(jac, eps_S, mode)


def _cg_solve(jac: Jacobian, eps_S, mode, x0, diag_shift, tol, maxiter):
    """SR by conjugate gradients on (S + diag_shift) x = F, warm-started from x0.

    S x = Obar^H (Obar x) from two products with the batch's derivatives of log psi: for an
    RBM each costs as much as a product with the dense O, and nothing of size N_s x P is
    built (neither O nor S).
    """
    matvec = lambda x: jac.rmatvec(jac.matvec(x)) + diag_shift * x  # noqa: E731
    F = force(jac, eps_S, mode)
    return jax.scipy.sparse.linalg.cg(matvec, F, x0=x0, tol=tol, maxiter=maxiter)[0]


def sr_update(jac: Jacobian, eps_S, mode, x0=None, *, diag_shift, solver, tol=1e-5, maxiter=None):
    """Stochastic reconfiguration in parameter space: (S + diag_shift) x = F.

    `x0` (the previous update) warm-starts the cg solver; the dense solvers ignore it.
    """
    if solver == "auto":
        n_params = jax.eval_shape(lambda e: force(jac, e, mode), eps_S).shape[0]
        solver = "cholesky" if n_params <= AUTO_DENSE_MAX_PARAMS else "cg"
    if solver == "cg":
        return _cg_solve(jac, eps_S, mode, x0, diag_shift, tol, maxiter)
    Obar_PxS = jac.dense()
    if mode == "real":
        A, _ = _split_samples(Obar_PxS, eps_S)
        S = A @ A.T
    else:
        S = _hermitian_gram(Obar_PxS)
    # The force from the matrix just built, not from another pass over the samples.
    return _solve_psd(_shifted(S, diag_shift), force(from_dense(Obar_PxS, mode), eps_S, mode), solver)


def minsr_update(jac: Jacobian, eps_S, mode, x0=None, *, diag_shift, solver):
    """minSR: the SR solution computed in sample space, x = A^H (A A^H + diag_shift)^-1 b."""
    Obar_PxS = jac.dense()
    if mode == "real":
        A, b = _split_samples(Obar_PxS, eps_S)
        return 2.0 * (A @ _solve_psd(_shifted(A.T @ A, diag_shift), b, solver))
    # Sample-space matrix Obar^T conj(Obar) = conj(conj(Obar)^T Obar): a Gram of the transpose.
    T = jnp.conj(_hermitian_gram(Obar_PxS.T))
    return 2.0 * (jnp.conj(Obar_PxS) @ _solve_psd(_shifted(T, diag_shift), eps_S, solver))


def none():
    """No preconditioner (plain gradient descent with the chosen optimizer)."""
    return identity_update


def sr(diag_shift: float = 0.01, solver: str = "auto", cg_tol: float = 1e-5, cg_maxiter: int = 1000):
    """SR. `solver`: cholesky (dense, with an eigh fallback), eigh (dense), cg (conjugate
    gradients on products with the log-derivatives, warm-started from the previous update,
    stopping at a relative residual `cg_tol` or after `cg_maxiter` iterations; cheaper for
    many parameters and never forms O), or auto (cholesky up to AUTO_DENSE_MAX_PARAMS
    parameters, cg above)."""
    require_number("diag_shift", diag_shift, nonnegative=True)
    require_choice("solver", solver, SOLVERS)
    require_number("cg_tol", cg_tol, positive=True)
    require_int("cg_maxiter", cg_maxiter, minimum=1)
    return functools.partial(sr_update, diag_shift=float(diag_shift), solver=solver,
                             tol=float(cg_tol), maxiter=cg_maxiter)


def minsr(diag_shift: float = 0.01, solver: str = "cholesky"):
    """Sample-space SR, for more parameters than samples. `solver`: cholesky or eigh."""
    require_number("diag_shift", diag_shift, nonnegative=True)
    require_choice("solver", solver, ("cholesky", "eigh"))
    return functools.partial(minsr_update, diag_shift=float(diag_shift), solver=solver)
