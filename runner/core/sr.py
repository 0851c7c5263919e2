"""Stochastic reconfiguration in parameter space: dense (Cholesky, eigh) and conjugate gradients.

(S + diag_shift) x = F, dense from the Gram matrix summed chain by chain, or by conjugate gradients
on products with the log-derivatives, deflated with eigenvectors recycled from earlier steps.
Complex Gram matrices are assembled from one real product of stacked real and imaginary parts
(faster than XLA's complex product on CPU; docs/notes/benchmarks.md has the timings). Conventions:
`runner.core.precond_types`.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from runner.core.diag_scale import chunks_of, metric_diagonal, relative_shift
from runner.core.precond_types import Jacobian, force, from_dense
from runner.parallel.mesh import meshed, replicated

# CG's relative residual, by the precision of the parameters (bytes of their real part): the
# default stopping tolerance, and the smallest one honoured. Rounding in the products (relative
# eps of 1.2e-7 in 32-bit) keeps the residual from going much below about eps times the
# condition number of S + diag_shift, so a 64-bit tolerance would run a 32-bit solve to
# cg_maxiter on every step.
CG_TOL_DEFAULT = {8: 1e-5, 4: 1e-3}


CG_TOL_FLOOR = {8: 1e-12, 4: 1e-4}


def shift_at(diag_shift, step, dtype):
    """(diag_shift at `step`, metrics info): a number as it is, with no info; a schedule (a
    function of the VMC step) evaluated and cast to the real dtype of `dtype` (a 64-bit value
    would promote a 32-bit solve), with info {"diag_shift": value}."""
    if not callable(diag_shift):
        return diag_shift, {}
    value = jnp.asarray(diag_shift(step), jnp.finfo(dtype).dtype)
    return value, {"diag_shift": value}


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


def _block_gram_and_force(A_PxT, e_T, mode):
    """S and F of one block of samples (all of them, or one chain's)."""
    if mode == "real":
        B, _ = _split_samples(A_PxT, e_T)
        S = B @ B.T
    else:
        S = _hermitian_gram(A_PxT)
    return S, force(from_dense(A_PxT, mode), e_T, mode)


def gram_and_force(Obar_PxS, eps_S, mode, n_chains):
    """(S, F) from the dense Obar, each chain's contribution computed on its own and added in
    chain order: the same bits on every layout, where one product over all samples would be
    split by the partitioner into per-device partial sums and an all-reduce.

    A scan over pairs of chains (one batched product per pair, then two additions in order):
    the chains' products are smaller than one product over all samples, and on CPU a pair per
    step runs faster than a chain per step (docs/notes/benchmarks.md). When the caller compiles under a mesh
    (`jax.set_mesh`), Obar is instead gathered onto every device for S (a sharding constraint to
    replicated: the same one product everywhere, cheaper for the P <= 500 of the dense solvers);
    F still goes chain pair by chain pair: its one product over the gathered samples was not the
    same bits on every layout once the residuals carry importance weights (a 12-site reweighted
    run, 1 against 4 devices).
    """
    if meshed():
        S = _block_gram_and_force(replicated(Obar_PxS), replicated(eps_S), mode)[0]
        return S, _by_chain_pairs(Obar_PxS, eps_S, n_chains, lambda A, e: force(from_dense(A, mode), e, mode))
    return _by_chain_pairs(Obar_PxS, eps_S, n_chains, lambda A, e: _block_gram_and_force(A, e, mode))


def _by_chain_pairs(Obar_PxS, eps_S, n_chains, one_chain):
    """The sum over chains of one_chain(Obar's columns of the chain, its eps), pair by pair
    (see `gram_and_force`)."""
    P, n_samples = Obar_PxS.shape
    pair = 2 if n_chains % 2 == 0 else 1
    A_GxKxPxT = jnp.moveaxis(Obar_PxS.reshape(P, n_chains // pair, pair, -1), 0, 2)
    eps_GxKxT = eps_S.reshape(n_chains // pair, pair, -1)

    def add(acc, block):
        out_K = jax.vmap(one_chain)(*block)
        for k in range(pair):
            acc = jax.tree_util.tree_map(lambda a, b: a + b[k], acc, out_K)
        return acc, None

    shapes = jax.eval_shape(one_chain, A_GxKxPxT[0, 0], eps_GxKxT[0, 0])
    zeros = jax.tree_util.tree_map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)
    return jax.lax.scan(add, zeros, (A_GxKxPxT, eps_GxKxT))[0]


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
    """M + diag_shift: a number times the identity, or a diagonal [P] (`runner.core.diag_scale`)."""
    if jnp.ndim(diag_shift) == 1:
        return M + jnp.diag(diag_shift.astype(M.dtype))
    return M + diag_shift * jnp.eye(M.shape[0], dtype=M.dtype)


# --- conjugate gradients, preconditioned by the previous steps' top eigenvectors ------------
#
# S changes little from one step to the next, and its few large eigenvalues are what makes CG
# slow (diag_shift sets the small end). So every `recycle_every` steps, CG runs plain and
# records its first 2r search directions p and their products A p (A = S + diag_shift); a
# Rayleigh-Ritz step on that Krylov space gives r approximate top eigenpairs (U, theta), and
# the following steps use the deflation preconditioner M^-1 = 1 + U diag(theta_r/theta - 1) U^H
# (theta_r the smallest of the r), which maps those eigenvalues to theta_r. M^-1 is symmetric
# positive definite for any orthonormal U, so a stale basis costs iterations, never
# correctness: CG still stops at the same relative residual. docs/notes/benchmarks.md gives the
# iteration counts it saves on the benchmark cases.


class CGState(NamedTuple):
    """What SR's conjugate gradients carry between steps."""

    x0: jax.Array  # the previous solution (warm start) [P]
    basis: jax.Array  # U [P, r]: approximate top eigenvectors of S + diag_shift, orthonormal
    scale: jax.Array  # [r], in (-1, 0]: M^-1 = 1 + U diag(scale) U^H (0 where unused)
    age: jax.Array  # int32: steps since the basis was refreshed
    plain_iters: jax.Array  # int32: CG iterations of the last refresh (a plain, undeflated solve)
    last_iters: jax.Array  # int32: CG iterations of the previous step


def _dot(a, b):
    return jnp.real(jnp.vdot(a, b))


def _pcg(A, b, x0, basis, scale, *, tol, maxiter, n_record):
    """Preconditioned CG on A x = b from x0, stopping at |r| <= tol |b| or after `maxiter`
    iterations.

    Returns:
        (x, record, iterations, |r| / |b|): record holds the first `n_record` search
        directions (normalised) and their products with A, as [2, n_record, P] (zero rows
        where CG stopped earlier); r is CG's recursively updated residual, the one it stops on.
    """
    basis_H = jnp.conj(basis.T)
    precondition = lambda v: v + basis @ (scale * (basis_H @ v))  # noqa: E731
    r = b - A(x0)
    z = precondition(r)
    bound = tol**2 * _dot(b, b)
    record = jnp.zeros((2, n_record, b.shape[0]), b.dtype)

    def cond(carry):
        _, r, _, _, k, _ = carry
        return (_dot(r, r) > bound) & (k < maxiter)

    def body(carry):
        x, r, p, rz, k, record = carry
        Ap = A(p)
        alpha = rz / _dot(p, Ap)
        if n_record:
            i = jnp.minimum(k, n_record - 1)
            row = jnp.stack([p, Ap]) / jnp.sqrt(_dot(p, p))
            record = record.at[:, i].set(jnp.where(k < n_record, row, record[:, i]))
        x, r = x + alpha * p, r - alpha * Ap
        z = precondition(r)
        rz_new = _dot(r, z)
        return x, r, z + (rz_new / rz) * p, rz_new, k + 1, record

    x, r, _, _, k, record = jax.lax.while_loop(cond, body, (x0, r, z, _dot(r, z), 0, record))
    b_norm2 = _dot(b, b)
    residual = jnp.sqrt(_dot(r, r) / jnp.where(b_norm2 > 0, b_norm2, 1.0))
    return x, record, k, residual


def _ritz(record, rank):
    """The `rank` largest Ritz pairs of A on the span of recorded directions (Rayleigh-Ritz
    with the exact products, so CG's loss of orthogonality leaves no ghost copies), as the
    deflation basis and scale of `CGState`."""
    P_mxP, AP_mxP = record
    gram = jnp.conj(P_mxP) @ P_mxP.T
    proj = jnp.conj(P_mxP) @ AP_mxP.T
    g, V = jnp.linalg.eigh((gram + jnp.conj(gram.T)) / 2)
    keep = g > 1e-10 * g[-1]  # drops unrecorded rows and near-dependent directions
    W = V * jnp.where(keep, 1.0 / jnp.sqrt(jnp.where(keep, g, 1.0)), 0.0)
    theta, Y = jnp.linalg.eigh(jnp.conj(W.T) @ ((proj + jnp.conj(proj.T)) / 2) @ W)
    theta, Y = theta[::-1][:rank], Y[:, ::-1][:, :rank]
    valid = theta > 0
    basis = jnp.where(valid, P_mxP.T @ (W @ Y), 0.0)
    smallest = jnp.min(jnp.where(valid, theta, jnp.inf))
    return basis, jnp.where(valid, smallest / jnp.where(valid, theta, 1.0) - 1.0, 0.0)


def cg_tolerance(cg_tol, dtype) -> float:
    """The relative residual CG stops at for parameters of `dtype`: the dtype's default when
    `cg_tol` is None, else `cg_tol`, but not below what the dtype can reach (CG_TOL_FLOOR)."""
    size = jnp.finfo(dtype).bits // 8
    if cg_tol is None:
        return CG_TOL_DEFAULT[size]
    return max(float(cg_tol), CG_TOL_FLOOR[size])


def _cg_solve(jac: Jacobian, eps_S, mode, state: CGState, *, diag_shift, tol, maxiter, recycle_every):
    """SR by conjugate gradients on (S + diag_shift) x = F, warm-started from the previous
    solution and deflated with the recycled basis (refreshed every `recycle_every` steps):
    (x, F, next state, info).

    S x = Obar^H (Obar x) from two products with the batch's derivatives of log psi: for an
    RBM each costs as much as a product with the dense O, and nothing of size N_s x P is
    built (neither O nor S).
    """
    A = lambda x: jac.rmatvec(jac.matvec(x)) + diag_shift * x  # noqa: E731
    F = force(jac, eps_S, mode)
    rank = state.basis.shape[1]
    # Refresh on schedule, or as soon as the deflated solve took more iterations than the last
    # plain one: early in a run S changes fast and a stale basis then hurts (docs/notes/benchmarks.md).
    refresh = (state.age % recycle_every == 0) | (state.last_iters > state.plain_iters)
    plain_on_refresh = jnp.where(refresh, 0.0, state.scale)
    x, record, iters, residual = _pcg(A, F, state.x0, state.basis, plain_on_refresh,
                                      tol=cg_tolerance(tol, F.dtype), maxiter=maxiter, n_record=2 * rank)
    basis, scale = state.basis, state.scale
    if rank:
        basis, scale = jax.lax.cond(refresh, lambda: _ritz(record, rank), lambda: (basis, scale))
    iters = jnp.asarray(iters, jnp.int32)
    state = CGState(x, basis, scale, jnp.where(refresh, 1, state.age + 1),
                    jnp.where(refresh, iters, state.plain_iters), iters)
    return x, F, state, {"cg_iters": iters, "cg_residual": residual}


def sr_update(jac: Jacobian, eps_S, mode, state, step=0, *, diag_shift, solver, tol=None, maxiter=1000,
              recycle_every=20, max_norm=None, diag_scale=None):
    """Stochastic reconfiguration in parameter space: (S + diag_shift) x = F, x then capped to a
    length of `max_norm` in the metric S (`_capped`; None: no cap).

    The cg solver carries a `CGState` (`sr`'s init decides, resolving "auto" from the number
    of parameters); the dense solvers carry nothing. `diag_shift`: a number, or a schedule
    read at `step`. With `diag_scale` (a number), the shift is the diagonal
    diag_shift + diag_scale diag(S) (`runner.core.diag_scale`; cg takes diag(S) from the
    Jacobian's chunks, one more pass over the samples).
    """
    if isinstance(state, CGState):
        shift, shown = shift_at(diag_shift, step, state.x0.dtype)
        if diag_scale is not None:
            shift = relative_shift(metric_diagonal(chunks_of(jac)), shift, diag_scale).astype(shift_dtype(state.x0))
        x, F, state, info = _cg_solve(jac, eps_S, mode, state, diag_shift=shift, tol=tol, maxiter=maxiter,
                                      recycle_every=recycle_every)
    else:
        # The force from the matrix just built, not from another pass over the samples.
        S, F = gram_and_force(jac.dense(), eps_S, mode, jac.n_chains)
        shift, shown = shift_at(diag_shift, step, S.dtype)
        if diag_scale is not None:
            shift = relative_shift(jnp.real(jnp.diagonal(S)), shift, diag_scale)
        x, info = _solve_psd(_shifted(S, shift), F, solver), {}
    x, capped = _capped(x, _real_dot(x, F), shift, max_norm)
    return x, state, {**info, **shown, **capped}


def shift_dtype(x):
    """The real dtype of x's precision (a diagonal shift in it keeps a 32-bit solve 32-bit)."""
    return jnp.finfo(x.dtype).dtype


def _real_dot(a, b):
    """Re(a^H b)."""
    return jnp.real(jnp.vdot(a, b))


def _capped(x, x_dot_F, shift, max_norm):
    """x scaled down to a length of at most `max_norm` in the metric S (None: as it is), and the
    info {"step_norm": its length before} (with a cap only). x solves (S + shift) x = F (shift a
    number or a diagonal [P]), so x^H S x = Re(x^H F) - x^H shift x needs no further product with
    S or the samples."""
    if max_norm is None:
        return x, {}
    shifted = _real_dot(x, shift * x) if jnp.ndim(shift) == 1 else shift * _real_dot(x, x)
    norm = jnp.sqrt(jnp.maximum(x_dot_F - shifted, 0.0))
    return x * (max_norm / jnp.maximum(norm, max_norm)), {"step_norm": norm}
