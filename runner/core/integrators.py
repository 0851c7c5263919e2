"""Explicit Runge-Kutta integrators over pytrees: Euler, Heun, RK4 (fixed step), Bogacki-Shampine
3(2) and Dormand-Prince 5(4) (adaptive), as pure functions that compile once.

An integrator is data (`Integrator`: a Butcher tableau, the first step, the controller's
settings); `init`, `step` and `advance` are pure functions of it. The time derivative is
f(t, y, carry) -> (dy/dt, carry): `carry` (any pytree of fixed structure: Markov chains, keys,
diagnostics) is threaded through every evaluation in order, rejected attempts included. The
state (`IntegratorState`) is a plain pytree of arrays, so it can be checkpointed; t and dt are
traced values, and step acceptance is a `jnp.where`, so one compiled `step` (or `advance`, a
`lax.while_loop` to a traced end time) serves a whole run.
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from runner.errors import ConfigError, require_number


class Tableau(NamedTuple):
    """An explicit Runge-Kutta method.

    a: rows of the lower-triangular stage matrix (row i has i entries); b: the weights of the
    solution carried forward, of order `order`; c: the stage times; b_low: the weights of the
    embedded solution of order `order_low` (None: no error estimate, fixed steps only);
    fsal: the last stage is f at the new solution (a[-1] == b), so the next step starts from it.
    """

    a: tuple
    b: tuple
    c: tuple
    order: int
    b_low: tuple | None = None
    order_low: int | None = None
    fsal: bool = False


EULER = Tableau(a=((),), b=(1.0,), c=(0.0,), order=1)
HEUN = Tableau(a=((), (1.0,)), b=(0.5, 0.5), c=(0.0, 1.0), order=2)
RK4 = Tableau(a=((), (0.5,), (0.0, 0.5), (0.0, 0.0, 1.0)), b=(1 / 6, 1 / 3, 1 / 3, 1 / 6), c=(0.0, 0.5, 0.5, 1.0),
              order=4)
# Bogacki and Shampine, Appl. Math. Lett. 2, 321 (1989).
RK23 = Tableau(
    a=((), (1 / 2,), (0.0, 3 / 4), (2 / 9, 1 / 3, 4 / 9)),
    b=(2 / 9, 1 / 3, 4 / 9, 0.0),
    c=(0.0, 1 / 2, 3 / 4, 1.0),
    order=3,
    b_low=(7 / 24, 1 / 4, 1 / 3, 1 / 8),
    order_low=2,
    fsal=True,
)
# Dormand and Prince, J. Comput. Appl. Math. 6, 19 (1980).
_DP_B = (35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84)
RK45 = Tableau(
    a=((), (1 / 5,), (3 / 40, 9 / 40), (44 / 45, -56 / 15, 32 / 9),
       (19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729),
       (9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656), _DP_B),
    b=(*_DP_B, 0.0),
    c=(0.0, 1 / 5, 3 / 10, 4 / 5, 8 / 9, 1.0, 1.0),
    order=5,
    b_low=(5179 / 57600, 0.0, 7571 / 16695, 393 / 640, -92097 / 339200, 187 / 2100, 1 / 40),
    order_low=4,
    fsal=True,
)


class Controller(NamedTuple):
    """Step-size control of an embedded pair: a step is accepted when the error norm
    (`error_norm`) is at most 1, or when it was already no longer than dt_min; the next step is
    dt * clip(safety * norm^(-1 / (order_low + 1)), min_factor, max_factor), within
    [dt_min, dt_max] (after a rejection it only shrinks)."""

    atol: float
    rtol: float
    dt_min: float
    dt_max: float
    safety: float = 0.9
    min_factor: float = 0.2
    max_factor: float = 5.0


class Integrator(NamedTuple):
    """A tableau, the first step size, and a `Controller` (None: every step is dt)."""

    tableau: Tableau
    dt: float
    controller: Controller | None = None


class IntegratorState(NamedTuple):
    """Where an integration stands; every field an array (or a pytree of them)."""

    t: jax.Array  # the time reached
    dt: jax.Array  # the step the next attempt takes (shortened only to land on an end time)
    k0: Any  # f(t, y) for a FSAL tableau (the next step's first stage); a projected step's `ptvmc.Memory`; else ()
    carry: Any  # what f threads through its evaluations
    n_accepted: jax.Array  # int32
    n_rejected: jax.Array  # int32


def _fixed(tableau, dt) -> Integrator:
    return Integrator(tableau, require_number("dt", dt, positive=True))


def euler(dt: float) -> Integrator:
    """Forward Euler (order 1), fixed step dt."""
    return _fixed(EULER, dt)


def heun(dt: float) -> Integrator:
    """Heun's method, the explicit trapezoid rule (order 2), fixed step dt."""
    return _fixed(HEUN, dt)


def rk4(dt: float) -> Integrator:
    """The classical fourth-order Runge-Kutta method, fixed step dt."""
    return _fixed(RK4, dt)


def _adaptive(tableau, dt, atol, rtol, dt_min, dt_max) -> Integrator:
    atol, rtol = require_number("atol", atol, nonnegative=True), require_number("rtol", rtol, nonnegative=True)
    if atol == 0 and rtol == 0:
        raise ConfigError("atol", "and rtol must not both be 0")
    dt_min, dt_max = require_number("dt_min", dt_min, positive=True), require_number("dt_max", dt_max, positive=True)
    if dt_min > dt_max:
        raise ConfigError("dt_min", f"must be at most dt_max (got {dt_min} > {dt_max})")
    dt = require_number("dt", dt, positive=True)
    if not dt_min <= dt <= dt_max:
        raise ConfigError("dt", f"must be within [dt_min, dt_max] = [{dt_min}, {dt_max}] (got {dt})")
    return Integrator(tableau, dt, Controller(atol, rtol, dt_min, dt_max))


def rk23(dt: float, *, atol: float, rtol: float, dt_min: float, dt_max: float) -> Integrator:
    """Bogacki-Shampine 3(2), adaptive: third-order steps, controlled by the embedded second-order
    solution; first step dt."""
    return _adaptive(RK23, dt, atol, rtol, dt_min, dt_max)


def rk45(dt: float, *, atol: float, rtol: float, dt_min: float, dt_max: float) -> Integrator:
    """Dormand-Prince 5(4), adaptive: fifth-order steps, controlled by the embedded fourth-order
    solution; first step dt."""
    return _adaptive(RK45, dt, atol, rtol, dt_min, dt_max)


def _time_dtype():
    return jnp.result_type(float)


def init(integrator: Integrator, f, t0, y0, carry=()) -> IntegratorState:
    """The state at time t0 with solution y0 (f is evaluated there for a FSAL tableau). A step that
    is not a Runge-Kutta method (`runner.core.ptvmc.PTVMC`) makes its own state: `integrator.init`."""
    if not isinstance(integrator, Integrator):
        return integrator.init(t0, y0, carry)
    t0 = jnp.asarray(t0, _time_dtype())
    k0 = ()
    if integrator.tableau.fsal:
        k0, carry = f(t0, y0, carry)
    zero = jnp.zeros((), jnp.int32)
    # JAX arrays throughout: a jitted step then sees the same argument types first and later.
    return jax.tree_util.tree_map(jnp.asarray, IntegratorState(t0, jnp.asarray(integrator.dt, _time_dtype()), k0,
                                                               carry, zero, zero))


def _add(y, dt, coefs, ks):
    """y + dt sum_j coefs[j] ks[j], leaf by leaf (zero coefficients skipped; dt in each leaf's
    real precision, so a float32 tree stays float32)."""
    def leaf(y_l, *k_l):
        terms = [c * k for c, k in zip(coefs, k_l) if c != 0]
        if not terms:
            return y_l
        return y_l + jnp.asarray(dt, jnp.finfo(y_l.dtype).dtype) * sum(terms[1:], terms[0])

    return jax.tree_util.tree_map(leaf, y, *ks)


def _attempt(tableau: Tableau, f, t, y, dt, state: IntegratorState):
    """One Runge-Kutta step of size dt from (t, y): (y_new, error estimate or None, the last
    stage's derivative, carry)."""
    carry, ks, y_i = state.carry, [], y
    for i, (row, c) in enumerate(zip(tableau.a, tableau.c)):
        if i == 0 and tableau.fsal:
            ks.append(state.k0)
            continue
        y_i = _add(y, dt, row, ks)
        k, carry = f(t + c * dt, y_i, carry)
        ks.append(k)
    y_new = y_i if tableau.fsal else _add(y, dt, tableau.b, ks)
    err = None
    if tableau.b_low is not None:
        zeros = jax.tree_util.tree_map(jnp.zeros_like, y)
        err = _add(zeros, dt, [hi - lo for hi, lo in zip(tableau.b, tableau.b_low)], ks)
    return y_new, err, ks[-1], carry


def error_norm(err, y, y_new, atol, rtol):
    """The RMS over every element of a pytree of |err| / (atol + rtol max(|y|, |y_new|)), complex
    elements by their modulus (each counts once): a step within tolerance has norm <= 1."""
    total, count = 0.0, 0
    for e, a, b in zip(*(jax.tree_util.tree_leaves(x) for x in (err, y, y_new))):
        scale = atol + rtol * jnp.maximum(jnp.abs(a), jnp.abs(b))
        total = total + jnp.sum((jnp.abs(e) / scale) ** 2)
        count += e.size
    return jnp.sqrt(total / max(count, 1))


def _next_dt(controller: Controller, tableau: Tableau, dt, norm):
    """(accept, the controller's next step) after a step of size dt with error norm `norm`."""
    accept = (norm <= 1.0) | (dt <= controller.dt_min)
    safe = jnp.where(norm > 0, norm, 1.0)
    factor = jnp.where(norm > 0, controller.safety * safe ** (-1.0 / (tableau.order_low + 1)), controller.max_factor)
    factor = jnp.clip(jnp.where(jnp.isfinite(factor), factor, controller.min_factor), controller.min_factor,
                      controller.max_factor)
    factor = jnp.where(accept, factor, jnp.minimum(factor, 1.0))
    return accept, jnp.clip(dt * factor, controller.dt_min, controller.dt_max)


def step(integrator: Integrator, f, y, state: IntegratorState, t_end=None):
    """One attempted step from state.t: (y, state), both unchanged but for the carry, dt and the
    rejection count when an adaptive step is rejected.

    With `t_end`, a step that would pass it (or fall short of it by at most 1e-9 of a step) is
    shortened to land on it exactly; the step size it was given is kept for the next step.
    A step no longer than dt_min is accepted whatever its error (a non-finite solution then
    shows in y).
    """
    tableau, controller = integrator.tableau, integrator.controller
    dt, last = state.dt, jnp.zeros((), bool)
    if t_end is not None:
        t_end = jnp.asarray(t_end, state.t.dtype)
        last = t_end - state.t <= state.dt * (1 + 1e-9)
        dt = jnp.where(last, t_end - state.t, state.dt)
    y_new, err, k_last, carry = _attempt(tableau, f, state.t, y, dt, state)
    if controller is None:
        accept, dt_next = jnp.ones((), bool), state.dt
    else:
        accept, dt_next = _next_dt(controller, tableau, dt, error_norm(err, y, y_new, controller.atol, controller.rtol))
        dt_next = jnp.where(accept & last, jnp.maximum(dt_next, state.dt), dt_next)
    t_new = jnp.where(last, t_end, state.t + dt) if t_end is not None else state.t + dt
    pick = lambda new, old: jax.tree_util.tree_map(lambda a, b: jnp.where(accept, a, b), new, old)  # noqa: E731
    return pick(y_new, y), IntegratorState(
        jnp.where(accept, t_new, state.t), dt_next, pick(k_last, state.k0) if tableau.fsal else (), carry,
        state.n_accepted + accept.astype(jnp.int32), state.n_rejected + (~accept).astype(jnp.int32))


def advance(integrator: Integrator, f, y, state: IntegratorState, t_end, max_steps: int = 100_000):
    """(y, state) at t_end, by steps (`step`) in a `lax.while_loop`: t_end is traced, so one
    compilation serves every end time (the save times of a run). Stops early after `max_steps`
    attempts; then state.t < t_end."""
    t_end = jnp.asarray(t_end, state.t.dtype)

    def body(loop):
        y, state, n = loop
        return (*step(integrator, f, y, state, t_end), n + 1)

    y, state, _ = jax.lax.while_loop(lambda loop: (loop[1].t < t_end) & (loop[2] < max_steps), body, (y, state, 0))
    return y, state
