"""Preconditioners of the energy gradient: none, SR (parameter space), minSR (sample space).

Each takes Obar as a `Jacobian`, the residuals eps_S and the gradient mode (conventions:
`runner.core.precond_types`) and returns the update direction. SR returns
(S + diag_shift I)^-1 F (`runner.core.sr`: dense, or conjugate gradients; with diag_scale the
shift is diag_shift + diag_scale diag(S), `runner.core.diag_scale`); minSR returns the same
vector through the sample-space identity (A^H A + l)^-1 A^H = A^H (A A^H + l)^-1, cheaper with
more parameters than samples (`runner.core.minsr`). This module holds what a preconditioner is,
the configured ones (the `conf/preconditioner` targets) and mixed precision.
"""

import functools
import logging
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

# Names that moved out of this module, importable here until their callers import them from their new homes.
from runner.core.minsr import (
    minsr_update,
)
from runner.core.precond_types import (
    Jacobian,
    SampleChunks,
    force,
)
from runner.core.sr import (
    CGState,
    cg_tolerance,
    shift_at,
    sr_update,
)
from runner.errors import ConfigError, require_choice, require_int, require_number

SOLVERS = ("auto", "cholesky", "eigh", "cg")
# solver "auto": dense Cholesky up to this many parameters, conjugate gradients above. Dense
# costs N_s P^2 (the Gram matrix) + P^3/3; CG about 100 iterations of 4 N_s P without forming
# O. The threshold comes from whole-step timings of both on the benchmark cases
# (docs/notes/benchmarks.md, "Where the time goes").
AUTO_DENSE_MAX_PARAMS = 500

log = logging.getLogger(__name__)


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


def identity_update(jac: Jacobian, eps_S, mode):
    """No preconditioning: the plain gradient."""
    return force(jac, eps_S, mode)


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


def _diag_scale(diag_scale):
    """diag_scale as a float (zero or positive), or None (a plain diag_shift)."""
    return None if diag_scale is None else require_number("diag_scale", diag_scale, nonnegative=True)


def sr(diag_shift: float = 0.01, *, solver: str = "auto", cg_tol: float | None = None, cg_maxiter: int = 1000,
       cg_recycle_rank: int = 48, cg_recycle_every: int = 20, max_norm: float | None = None,
       diag_scale: float | None = None) -> Preconditioner:
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
    distance); None: no cap. `diag_scale`: the shift becomes the diagonal diag_shift +
    diag_scale diag(S) (`runner.core.diag_scale`); None: diag_shift alone."""
    diag_shift = _number_or_schedule(diag_shift)
    max_norm, diag_scale = _max_norm(max_norm), _diag_scale(diag_scale)
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
        recycle_every=cg_recycle_every, max_norm=max_norm, diag_scale=diag_scale))


def minsr(diag_shift: float = 0.01, *, solver: str = "cholesky", momentum: float = 0.0,
          max_norm: float | None = None, param_chunk_size: int | None = None,
          diag_scale: float | None = None) -> Preconditioner:
    """Sample-space SR, for more parameters than samples. `solver`: cholesky or eigh.
    `momentum`: SPRING's mu in [0, 1) (0: plain minSR; see `minsr_update`).
    `diag_shift`: a number, or a schedule (a function of the VMC step; runner.config.schedules).
    `max_norm`: the trust region of `sr` (not with momentum).
    `param_chunk_size`: build the kernel from blocks of whole parameter leaves of at most this
    many numbers (a larger leaf is a block of its own), each block's derivatives made on their
    own: memory a block's columns instead of all P, for one more derivative pass per block
    (None: all parameters at once). `diag_scale`: as in `sr`."""
    diag_shift = _number_or_schedule(diag_shift)
    max_norm, diag_scale = _max_norm(max_norm), _diag_scale(diag_scale)
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
                                      momentum=float(momentum), max_norm=max_norm, param_chunk_size=param_chunk_size,
                                      diag_scale=diag_scale)
        return x, state, {**info, **shown}

    return Preconditioner(init, update)
