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
parts (faster than XLA's complex product on CPU; docs/benchmarks.md has the timings).
"""

import functools
import logging
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from runner.errors import ConfigError, require_choice, require_int, require_number
from runner.parallel.mesh import meshed, replicated, spread_over_chains

SOLVERS = ("auto", "cholesky", "eigh", "cg")
# solver "auto": dense Cholesky up to this many parameters, conjugate gradients above. Dense
# costs N_s P^2 (the Gram matrix) + P^3/3; CG about 100 iterations of 4 N_s P without forming
# O. The threshold comes from whole-step timings of both on the benchmark cases
# (docs/benchmarks.md, "Where the time goes").
AUTO_DENSE_MAX_PARAMS = 500

log = logging.getLogger(__name__)

# CG's relative residual, by the precision of the parameters (bytes of their real part): the
# default stopping tolerance, and the smallest one honoured. Rounding in the products (relative
# eps of 1.2e-7 in 32-bit) keeps the residual from going much below about eps times the
# condition number of S + diag_shift, so a 64-bit tolerance would run a 32-bit solve to
# cg_maxiter on every step.
CG_TOL_DEFAULT = {8: 1e-5, 4: 1e-3}
CG_TOL_FLOOR = {8: 1e-12, 4: 1e-4}


class Preconditioner(NamedTuple):
    """A configured preconditioner, carrying a state from one VMC step to the next.

    init: the flat parameters in solver coordinates (anything with .shape and .dtype) ->
        the initial state (a pytree; () for the stateless ones);
    update: (jac, eps_S, mode, state, step=0) -> (update direction, next state, info): `step`
        the VMC step (0 at the first; a `diag_shift` schedule is read there), info a dict of
        scalars for the step's metrics ({} for the direct solvers; CG: `cg_iters`,
        `cg_residual`; `diag_shift` when it is a schedule).
    """

    init: Callable
    update: Callable

    def __call__(self, jac, eps_S, mode, state=None, step=0):
        """One solve (from the initial state unless one is given): the update direction."""
        if state is None:
            state = self.init(jax.eval_shape(lambda e: force(jac, e, mode), eps_S))
        return self.update(jac, eps_S, mode, state, step)[0]


def stateless(update) -> Preconditioner:
    """A Preconditioner from (jac, eps_S, mode) -> direction."""
    return Preconditioner(lambda flat: (), lambda jac, eps_S, mode, state, step=0: (update(jac, eps_S, mode), state, {}))


def solving_in(precondition: Preconditioner, dtype) -> Preconditioner:
    """Mixed precision: the dense solvers (cholesky/eigh SR, minSR) get Obar and eps_S promoted
    to `dtype`'s precision (jnp.float64: float32 -> float64, complex64 -> complex128), so S or T
    is built and solved in it; a state they return keeps the dtypes it came in (the VMC state
    stays in the parameters' precision) and the caller casts the direction back. CG is left as
    it is: its products with O run in the model's precision, so its vectors and tolerance stay
    those of the parameters (a 64-bit CG on 32-bit products would stall at their rounding)."""
    inner = precondition.update
    keywords = dict(getattr(inner, "keywords", {}))  # sr's settings stay readable (app._cg_maxiter)
    return Preconditioner(precondition.init, functools.partial(
        _update_in, update=getattr(inner, "func", inner), dtype=dtype, **keywords))


def _update_in(jac, eps_S, mode, state, step=0, *, update, dtype, **keywords):
    """`solving_in`'s update: `update(..., **keywords)` on promoted inputs, unless CG. The dense
    Obar and its sample chunks (what S and T are built from) are promoted; the products with
    vectors (matvec, rmatvec) stay the model's."""
    if isinstance(state, CGState):
        return update(jac, eps_S, mode, state, step, **keywords)
    wide = lambda x: x.astype(jnp.promote_types(x.dtype, dtype))  # noqa: E731
    dense, chunks = jac.dense, getattr(jac, "chunks", None)
    jac = jac._replace(dense=lambda: wide(dense()))
    if chunks is not None:
        jac = jac._replace(chunks=_widened(chunks, wide))
    x, new_state, info = update(jac, wide(eps_S), mode, state, step, **keywords)
    return x, jax.tree_util.tree_map(lambda new, old: new.astype(old.dtype), new_state, state), info


def _widened(chunks: "SampleChunks", wide) -> "SampleChunks":
    """The chunks (and their parameter blocks) with `wide` applied to every chunk made."""
    def start():
        rows = chunks.start()
        return lambda k: wide(rows(k))

    by_parameters = chunks.by_parameters
    if by_parameters is not None:
        return chunks._replace(start=start, by_parameters=lambda size: [_widened(c, wide) for c in by_parameters(size)])
    return chunks._replace(start=start)


def shift_at(diag_shift, step, dtype):
    """(diag_shift at `step`, metrics info): a number as it is, with no info; a schedule (a
    function of the VMC step) evaluated and cast to the real dtype of `dtype` (a 64-bit value
    would promote a 32-bit solve), with info {"diag_shift": value}."""
    if not callable(diag_shift):
        return diag_shift, {}
    value = jnp.asarray(diag_shift(step), jnp.finfo(dtype).dtype)
    return value, {"diag_shift": value}


class Jacobian(NamedTuple):
    """Obar (see the module docstring) of one batch of samples.

    dense: () -> Obar_PxS, materialised (only when a preconditioner calls it); its samples are
        n_chains chains of N_s / n_chains consecutive samples;
    matvec: v_P -> Obar v; rmatvec: w -> Obar^H w, without forming Obar. In mode "real" with
        a complex log psi both act on real sample vectors (Re; Im) of length 2 N_s;
    to_samples: eps_S -> eps in the coordinates of matvec's output;
    n_chains: the dense solvers sum over samples chain by chain in this fixed order, so their
        result does not depend on how the chains are spread over devices;
    chunks: Obar chunk by chunk for the sample-space solver (`SampleChunks`), or None (then
        it takes `dense` as one chunk).
    """

    dense: Callable
    matvec: Callable
    rmatvec: Callable
    to_samples: Callable
    n_chains: int = 1
    chunks: "SampleChunks | None" = None


class SampleChunks(NamedTuple):
    """Obar as n chunks of rows (samples first), each made when asked, for building minSR's
    sample-space kernel without holding all of Obar.

    n: the number of chunks; chunk k holds samples k t .. (k + 1) t - 1 of every chain;
    start: () -> rows, rows: k (an int, may be traced) -> chunk k of Obar^T, [C, t, P] (complex
        when log psi is, in every mode). `start` computes what every chunk needs (the mean of
        O over all samples) where it is called: call it once, outside any loop over chunks.
    by_parameters: size -> [SampleChunks], the same chunks split by columns into blocks of
        parameters (at most `size` each where the parameters allow; every column in exactly one
        block), each made without the others (None: not offered, use the chunks whole).
    """

    n: int
    start: Callable
    by_parameters: Callable | None = None


def from_products(dense, apply, apply_T, out_dtype, n_samples, mode, n_chains=1, chunks=None) -> Jacobian:
    """A Jacobian from a linear map v_P -> Obar v [N_s] (`apply`, of dtype `out_dtype`) and its
    linear transpose w -> Obar^T w (`apply_T`, no conjugation), in the conventions of `mode`."""
    if mode == "holomorphic":
        # Obar^H w = conj(Obar^T conj(w)).
        return Jacobian(dense, apply, lambda w: jnp.conj(apply_T(jnp.conj(w))), lambda e: e, n_chains, chunks)
    if not jnp.issubdtype(out_dtype, jnp.complexfloating):
        return Jacobian(dense, apply, lambda w: jnp.real(apply_T(w)), jnp.real, n_chains, chunks)
    # Real parameters, complex log psi: samples in real coordinates (Re; Im). For real v,
    # Re(Obar^T (w_re - i w_im)) = Re(Obar)^T w_re + Im(Obar)^T w_im.
    stack = lambda y: jnp.concatenate([jnp.real(y), jnp.imag(y)])  # noqa: E731
    return Jacobian(
        dense,
        lambda v: stack(apply(v)),
        lambda w: jnp.real(apply_T((w[:n_samples] - 1j * w[n_samples:]).astype(out_dtype))),
        lambda e: stack(e.astype(out_dtype)),
        n_chains,
        chunks,
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


def _block_gram_and_force(A_PxT, e_T, mode):
    """S and F of one block of samples (all of them, or one chain's)."""
    if mode == "real":
        B, _ = _split_samples(A_PxT, e_T)
        S = B @ B.T
    else:
        S = _hermitian_gram(A_PxT)
    return S, force(from_dense(A_PxT, mode), e_T, mode)


def _gram_and_force(Obar_PxS, eps_S, mode, n_chains):
    """(S, F) from the dense Obar, each chain's contribution computed on its own and added in
    chain order: the same bits on every layout, where one product over all samples would be
    split by the partitioner into per-device partial sums and an all-reduce.

    A scan over pairs of chains (one batched product per pair, then two additions in order):
    the chains' products are smaller than one product over all samples, and on CPU a pair per
    step runs faster than a chain per step (docs/benchmarks.md). When the caller compiles under a mesh
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


def _after(x, y):
    """x, made to depend on y (x + 0 y[0], which XLA does not fold: 0 NaN is NaN).

    XLA:CPU runs independent operations concurrently, each device in its own order: a
    collective inside a loop (the kernel's chunk gathers) and an independent one outside it
    (the gather of the right-hand side for the solve) then ran in opposite orders on two
    devices, each waiting for the other forever (the 6 x 6 ViT's step on two virtual devices,
    docs/benchmarks.md). Gathering y first and starting the loop from x orders them."""
    if y is None:
        return x
    first = jnp.real(jnp.ravel(y)[0]).astype(jnp.real(x).dtype)
    return x + jnp.zeros((), first.dtype) * first


def _by_chain_pairs(Obar_PxS, eps_S, n_chains, one_chain):
    """The sum over chains of one_chain(Obar's columns of the chain, its eps), pair by pair
    (see `_gram_and_force`)."""
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


def identity_update(jac: Jacobian, eps_S, mode):
    """No preconditioning: the plain gradient."""
    return force(jac, eps_S, mode)


# --- conjugate gradients, preconditioned by the previous steps' top eigenvectors ------------
#
# S changes little from one step to the next, and its few large eigenvalues are what makes CG
# slow (diag_shift sets the small end). So every `recycle_every` steps, CG runs plain and
# records its first 2r search directions p and their products A p (A = S + diag_shift); a
# Rayleigh-Ritz step on that Krylov space gives r approximate top eigenpairs (U, theta), and
# the following steps use the deflation preconditioner M^-1 = 1 + U diag(theta_r/theta - 1) U^H
# (theta_r the smallest of the r), which maps those eigenvalues to theta_r. M^-1 is symmetric
# positive definite for any orthonormal U, so a stale basis costs iterations, never
# correctness: CG still stops at the same relative residual. docs/benchmarks.md gives the
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


def _pcg(A, b, x0, basis, scale, tol, maxiter, n_record):
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


def _cg_solve(jac: Jacobian, eps_S, mode, state: CGState, diag_shift, tol, maxiter, recycle_every):
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
    # plain one: early in a run S changes fast and a stale basis then hurts (measured on tfim2d:
    # 102 -> 320 iterations over the first 20 steps with the step-0 basis; docs/benchmarks.md).
    refresh = (state.age % recycle_every == 0) | (state.last_iters > state.plain_iters)
    plain_on_refresh = jnp.where(refresh, 0.0, state.scale)
    x, record, iters, residual = _pcg(A, F, state.x0, state.basis, plain_on_refresh,
                                      cg_tolerance(tol, F.dtype), maxiter, 2 * rank)
    basis, scale = state.basis, state.scale
    if rank:
        basis, scale = jax.lax.cond(refresh, lambda: _ritz(record, rank), lambda: (basis, scale))
    iters = jnp.asarray(iters, jnp.int32)
    state = CGState(x, basis, scale, jnp.where(refresh, 1, state.age + 1),
                    jnp.where(refresh, iters, state.plain_iters), iters)
    return x, F, state, {"cg_iters": iters, "cg_residual": residual}


def sr_update(jac: Jacobian, eps_S, mode, state, step=0, *, diag_shift, solver, tol=None, maxiter=1000,
              recycle_every=20, max_norm=None):
    """Stochastic reconfiguration in parameter space: (S + diag_shift) x = F, x then capped to a
    length of `max_norm` in the metric S (`_capped`; None: no cap).

    The cg solver carries a `CGState` (`sr`'s init decides, resolving "auto" from the number
    of parameters); the dense solvers carry nothing. `diag_shift`: a number, or a schedule
    read at `step`.
    """
    if isinstance(state, CGState):
        shift, shown = shift_at(diag_shift, step, state.x0.dtype)
        x, F, state, info = _cg_solve(jac, eps_S, mode, state, shift, tol, maxiter, recycle_every)
    else:
        # The force from the matrix just built, not from another pass over the samples.
        S, F = _gram_and_force(jac.dense(), eps_S, mode, jac.n_chains)
        shift, shown = shift_at(diag_shift, step, S.dtype)
        x, info = _solve_psd(_shifted(S, shift), F, solver), {}
    x, capped = _capped(x, _real_dot(x, F), shift, max_norm)
    return x, state, {**info, **shown, **capped}


def _real_dot(a, b):
    """Re(a^H b)."""
    return jnp.real(jnp.vdot(a, b))


def _capped(x, x_dot_F, shift, max_norm):
    """x scaled down to a length of at most `max_norm` in the metric S (None: as it is), and the
    info {"step_norm": its length before} (with a cap only). x solves (S + shift) x = F, so
    x^H S x = Re(x^H F) - shift |x|^2 needs no further product with S or the samples."""
    if max_norm is None:
        return x, {}
    norm = jnp.sqrt(jnp.maximum(x_dot_F - shift * _real_dot(x, x), 0.0))
    return x * (max_norm / jnp.maximum(norm, max_norm)), {"step_norm": norm}


def _chunks_of(jac: Jacobian) -> SampleChunks:
    """The Jacobian's chunks, or its dense matrix as one chunk."""
    if jac.chunks is not None:
        return jac.chunks

    def start():
        Obar_PxS = jac.dense()
        rows_CxTxP = Obar_PxS.T.reshape(jac.n_chains, Obar_PxS.shape[1] // jac.n_chains, Obar_PxS.shape[0])
        return lambda k: rows_CxTxP

    return SampleChunks(1, start)


def parameter_kernel(chunks: SampleChunks, mode, param_chunk_size=None, after=None):
    """`sample_kernel`, or with `param_chunk_size` the sum of the kernels of the chunks'
    parameter blocks (`SampleChunks.by_parameters`), one block after another in a fixed order:
    what is held is a block's columns of two chunks, not all P. Chunks that offer no blocks (a
    dense Jacobian's, whole anyway) give their kernel whole. `after`: as in `sample_kernel`."""
    if param_chunk_size is None or chunks.by_parameters is None:
        return sample_kernel(chunks, mode, after)
    blocks = chunks.by_parameters(param_chunk_size)
    kernels = [functools.partial(sample_kernel, block, mode, after) for block in blocks]
    if len(kernels) == 1:
        return kernels[0]()
    # One block per iteration of a loop (a branch of a switch each): the blocks' buffers are
    # never live together, as they could be in straight-line code.
    return jax.lax.fori_loop(1, len(kernels), lambda j, T: T + jax.lax.switch(j, kernels), kernels[0]())


def _kernel_rows(Obar_CxtxP, mode):
    """A chunk's rows of the sample-space problem's matrix A (A^H A = S), chain-major [C G t, P]:
    in mode "real" with a complex log psi each chain's real parts, then its imaginary parts
    (G = 2: the real problem with twice the samples); else Obar's rows as they are (G = 1)."""
    if mode == "real" and jnp.iscomplexobj(Obar_CxtxP):
        Obar_CxtxP = jnp.stack([jnp.real(Obar_CxtxP), jnp.imag(Obar_CxtxP)], axis=1)
    return Obar_CxtxP.reshape(-1, Obar_CxtxP.shape[-1])


def _kernel_block(R_axP, R_bxP):
    """R_a R_b^H [a, b]: complex blocks from four real products (faster than XLA's complex
    product on CPU). Each product has R_b's rows as its columns, whole on every device: XLA's
    CPU products give the same bits for any split of the rows of R_a (not for a split of the
    columns), which makes the kernel the same on every layout."""
    if not jnp.iscomplexobj(R_axP):
        return R_axP @ R_bxP.T
    ar, ai, br, bi = jnp.real(R_axP), jnp.imag(R_axP), jnp.real(R_bxP), jnp.imag(R_bxP)
    return jax.lax.complex(ar @ br.T + ai @ bi.T, ai @ br.T - ar @ bi.T)


def sample_kernel(chunks: SampleChunks, mode, after=None):
    """minSR's kernel T = A A^H [Q, Q] (Q = G N_s; G as in `_kernel_rows`), built block by block
    from the chunks of Obar, in kernel order: chunk, chain, G, sample of the chunk.

    Two chunks are held at a time (with what making O takes: a few chunk_size x P, plus T):
    the outer loop makes chunk a once, the inner one makes each later chunk b again, and T's
    lower blocks are the conjugate transposes of the upper ones (n (n + 1) / 2 of the n^2 block
    products). Compiled under a mesh, each device makes the rows of its own chains, then chunk
    b alone is gathered onto every device (never the whole Obar) and each device multiplies its
    rows of a with it; T is gathered (replicated) for the solve. With `after` (an array), the
    kernel's gathers and loops start only once it is computed (`_after`), and so does a loop
    around the kernel (`parameter_kernel`'s over parameter blocks).
    """
    spread, whole = spread_over_chains, replicated
    rows = chunks.start()
    chunk_rows = lambda k: spread(_kernel_rows(rows(k), mode))  # noqa: E731
    if chunks.n == 1:
        R_QxP = _after(chunk_rows(0), after)
        return whole(_kernel_block(R_QxP, whole(R_QxP)))
    R_shape = jax.eval_shape(chunk_rows, 0)
    Q, dtype = R_shape.shape[0], R_shape.dtype
    T_nQxnQ = _after(whole(jnp.zeros((chunks.n, Q, chunks.n, Q), dtype)), after)

    def outer(a, T):
        R_a = chunk_rows(a)
        T = T.at[a, :, a].set(whole(_kernel_block(R_a, whole(R_a))))

        def inner(b, T):
            B_QxQ = whole(_kernel_block(R_a, whole(chunk_rows(b))))
            return T.at[a, :, b].set(B_QxQ).at[b, :, a].set(jnp.conj(B_QxQ.T))

        return jax.lax.fori_loop(a + 1, chunks.n, inner, T)

    T_nQxnQ = jax.lax.fori_loop(0, chunks.n, outer, T_nQxnQ)
    return T_nQxnQ.reshape(chunks.n * Q, chunks.n * Q)


def _kernel_order(shape, inverse=False):
    """Permutes sample vectors between the Jacobian's coordinates (G, chain, sample of the
    chain; `to_samples`) and `sample_kernel`'s (chunk, chain, G, sample of the chunk)."""
    n, C, G, t = shape
    if inverse:
        return lambda y: y.reshape(n, C, G, t).transpose(2, 1, 0, 3).reshape(-1)
    return lambda v: v.reshape(G, C, n, t).transpose(2, 1, 0, 3).reshape(-1)


def minsr_update(jac: Jacobian, eps_S, mode, state, *, diag_shift, solver, momentum=0.0, max_norm=None,
                 param_chunk_size=None):
    """minSR: the SR solution in sample space, x = A^H (A A^H + diag_shift)^-1 b, with the
    kernel A A^H built chunk by chunk (`sample_kernel`; with `param_chunk_size`, also block by
    block of parameters, `parameter_kernel`) and x = A^H y by the Jacobian's products
    (per-chain sums in a fixed order). Without momentum, x is capped to a length of
    `max_norm` in the metric S (`_capped`; None: no cap).

    With `momentum` mu > 0, SPRING (Goldshlager, Abrahamsen, Lin, J. Comput. Phys. 2024):
    x_k = A^+ (b - mu A x_{k-1}) + mu x_{k-1}, A^+ = A^H (A A^H + diag_shift + 1 1^T / N_s)^-1,
    `state` the previous x; the 1 1^T / N_s (one per real sample group) lifts the kernel's null
    direction of centred derivatives and changes nothing in exact arithmetic.

    Returns:
        (x [P], next state, info).
    """
    chunks = _chunks_of(jac)
    b = jac.to_samples(eps_S)
    C, t, _ = jax.eval_shape(lambda: chunks.start()(0)).shape
    n_samples = C * t * chunks.n
    shape = (chunks.n, C, b.shape[0] // n_samples, t)
    to_kernel, from_kernel = _kernel_order(shape), _kernel_order(shape, inverse=True)
    # The right-hand side whole on every device before the kernel's loops start (`_after`).
    b_Q = replicated(to_kernel(b if not momentum else 2.0 * b - momentum * jac.matvec(state)))
    T_QxQ = _shifted(parameter_kernel(chunks, mode, param_chunk_size, after=b_Q), diag_shift)
    if not momentum:
        y_Q = replicated(_solve_psd(T_QxQ, b_Q, solver))
        x = 2.0 * jac.rmatvec(from_kernel(y_Q))
        # x = 2 A^H y, F = 2 A^H b and (A A^H + shift) y = b give x^H F = 4 (|b|^2 - shift y^H b);
        # the dot products over samples on every device whole (the same bits on every layout).
        x, info = _capped(x, 4.0 * (_real_dot(b_Q, b_Q) - diag_shift * _real_dot(y_Q, b_Q)), diag_shift, max_norm)
        return x, state, info
    group_Q = jnp.broadcast_to(jnp.arange(shape[2])[:, None], shape).reshape(-1)
    ones_QxQ = (group_Q[:, None] == group_Q[None, :]).astype(T_QxQ.dtype) / n_samples
    x = jac.rmatvec(from_kernel(_solve_psd(T_QxQ + ones_QxQ, b_Q, solver))) + momentum * state
    return x, x, {}


def _number_or_schedule(diag_shift):
    """diag_shift as a float (zero or positive), or a schedule as it is (checked by
    runner.config.schedules when built from the config)."""
    return diag_shift if callable(diag_shift) else require_number("diag_shift", diag_shift, nonnegative=True)


def none() -> Preconditioner:
    """No preconditioner (plain gradient descent with the chosen optimizer)."""
    return stateless(identity_update)


def _max_norm(max_norm):
    """max_norm as a positive float, or None (no cap)."""
    return None if max_norm is None else require_number("max_norm", max_norm, positive=True)


def sr(diag_shift: float = 0.01, solver: str = "auto", cg_tol: float | None = None, cg_maxiter: int = 1000,
       cg_recycle_rank: int = 48, cg_recycle_every: int = 20, max_norm: float | None = None) -> Preconditioner:
    """SR. `solver`: cholesky (dense, with an eigh fallback), eigh (dense), cg (conjugate
    gradients on products with the log-derivatives, warm-started from the previous update,
    stopping at a relative residual `cg_tol` (None: the dtype's default, see `cg_tolerance`;
    one below what the dtype can reach is raised to that, with a warning) or after
    `cg_maxiter` iterations, preconditioned
    with `cg_recycle_rank` approximate top eigenvectors of S refreshed every `cg_recycle_every`
    steps (rank 0: plain CG); cheaper for many parameters and never forms O), or auto
    (cholesky up to AUTO_DENSE_MAX_PARAMS parameters, cg above). `diag_shift`: a number, or a
    schedule (a function of the VMC step, e.g. an optax schedule; runner.config.schedules).
    `max_norm`: a trust region; the direction x is scaled down to sqrt(x^H S x) <= max_norm, so
    a step of learning rate l changes the state by at most about l max_norm (Fubini-Study
    distance); None: no cap."""
    diag_shift = _number_or_schedule(diag_shift)
    max_norm = _max_norm(max_norm)
    require_choice("solver", solver, SOLVERS)
    if cg_tol is not None:
        require_number("cg_tol", cg_tol, positive=True)
    require_int("cg_maxiter", cg_maxiter, minimum=1)
    require_int("cg_recycle_rank", cg_recycle_rank, minimum=0)
    require_int("cg_recycle_every", cg_recycle_every, minimum=1)

    def init(flat):
        n_params = flat.shape[0]
        dense = solver != "cg" and not (solver == "auto" and n_params > AUTO_DENSE_MAX_PARAMS)
        if dense:
            return ()
        tol = cg_tolerance(cg_tol, flat.dtype)
        if cg_tol is not None and tol > cg_tol:
            log.warning("preconditioner.cg_tol=%g is below what %s parameters can reach; CG stops at "
                        "a relative residual of %g instead", cg_tol, jnp.dtype(flat.dtype).name, tol)
        rank = min(cg_recycle_rank, n_params // 2)
        return CGState(jnp.zeros(n_params, flat.dtype), jnp.zeros((n_params, rank), flat.dtype),
                       jnp.zeros(rank, jnp.finfo(flat.dtype).dtype), jnp.zeros((), jnp.int32),
                       jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))

    return Preconditioner(init, functools.partial(
        sr_update, diag_shift=diag_shift, solver=solver, tol=cg_tol, maxiter=cg_maxiter,
        recycle_every=cg_recycle_every, max_norm=max_norm))


def minsr(diag_shift: float = 0.01, solver: str = "cholesky", momentum: float = 0.0,
          max_norm: float | None = None, param_chunk_size: int | None = None) -> Preconditioner:
    """Sample-space SR, for more parameters than samples. `solver`: cholesky or eigh.
    `momentum`: SPRING's mu in [0, 1) (0: plain minSR; see `minsr_update`).
    `diag_shift`: a number, or a schedule (a function of the VMC step; runner.config.schedules).
    `max_norm`: the trust region of `sr` (not with momentum).
    `param_chunk_size`: build the kernel from blocks of whole parameter leaves of at most this
    many numbers (a larger leaf is a block of its own), each block's derivatives made on their
    own: memory a block's columns instead of all P, for one more derivative pass per block
    (None: all parameters at once)."""
    diag_shift = _number_or_schedule(diag_shift)
    max_norm = _max_norm(max_norm)
    if param_chunk_size is not None:
        param_chunk_size = require_int("param_chunk_size", param_chunk_size, minimum=1)
    require_choice("solver", solver, ("cholesky", "eigh"))

    require_number("momentum", momentum, nonnegative=True)
    if not momentum < 1:
        raise ConfigError("momentum", f"must be below 1 (got {momentum})")
    if momentum and max_norm is not None:
        raise ConfigError("max_norm", "must be null with momentum (SPRING's update is not the solve the cap "
                                      "measures)")

    def init(flat):  # SPRING carries the previous update
        return jnp.zeros(flat.shape, flat.dtype) if momentum else ()

    def update(jac, eps_S, mode, state, step=0):
        shift, shown = shift_at(diag_shift, step, eps_S.dtype)
        x, state, info = minsr_update(jac, eps_S, mode, state, diag_shift=shift, solver=solver,
                                      momentum=float(momentum), max_norm=max_norm, param_chunk_size=param_chunk_size)
        return x, state, {**info, **shown}

    return Preconditioner(init, update)
