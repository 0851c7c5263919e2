"""Schedules from the config: a `_target_` node where a number is, checked as a function of the VMC step."""

import math

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np

from runner.errors import ConfigError

# The config keys that take a schedule, and where the step reaches it: optax counts the
# learning rate's steps in its own state; the preconditioner is handed the VMC step.
SCHEDULED = ("optimizer.learning_rate", "preconditioner.diag_shift")
EXAMPLE = "e.g. {_target_: optax.cosine_decay_schedule, init_value: 0.02, decay_steps: 1000}"


class _Unevaluable(Exception):
    """A schedule uses an operation `_evaluate` does not know."""


def _divide(a, b):
    if np.issubdtype(np.result_type(a, b), np.integer):  # lax.div truncates integers
        return np.trunc(np.true_divide(a, b)).astype(np.result_type(a, b))
    return np.true_divide(a, b)


def _round(x, rounding_method=0):
    return np.round(x) if int(rounding_method) == 1 else np.sign(x) * np.floor(np.abs(x) + 0.5)


# The elementwise primitives optax's schedules are made of, in NumPy.
_NUMPY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": _divide, "rem": np.fmod,
    "max": np.maximum, "min": np.minimum, "pow": np.power, "neg": np.negative, "abs": np.abs,
    "sign": np.sign, "floor": np.floor, "ceil": np.ceil, "exp": np.exp, "exp2": np.exp2, "log": np.log,
    "log1p": np.log1p, "expm1": np.expm1, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x),
    "square": np.square, "cos": np.cos, "sin": np.sin, "tan": np.tan, "tanh": np.tanh,
    "lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal, "eq": np.equal,
    "ne": np.not_equal, "and": np.logical_and, "or": np.logical_or, "not": np.logical_not,
    "stop_gradient": lambda x: x, "copy": lambda x: x, "copy_p": lambda x: x,
    "clamp": lambda lo, x, hi: np.clip(x, lo, hi),
    "select_n": lambda which, *cases: np.choose(np.asarray(which, int), cases),
}


def _evaluate(jaxpr, consts, args):
    """Runs a jaxpr with NumPy (no JAX device is touched: this happens before
    `jax.distributed.initialize` and before the CPU device count is set)."""
    env = dict(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    read = lambda v: v.val if isinstance(v, jax.extend.core.Literal) else env[v]  # noqa: E731
    for eqn in jaxpr.eqns:
        ins, name, params = [read(v) for v in eqn.invars], eqn.primitive.name, eqn.params
        inner = params.get("jaxpr", params.get("call_jaxpr"))
        if inner is not None:  # jit, closed_call, custom_jvp_call: the body
            closed = inner if hasattr(inner, "consts") else None
            outs = _evaluate(closed.jaxpr if closed else inner, closed.consts if closed else [], ins)
        elif name == "integer_pow":
            outs = [np.power(ins[0], params["y"])]
        elif name == "convert_element_type":
            outs = [np.asarray(ins[0]).astype(params["new_dtype"])]
        elif name == "round":
            outs = [_round(ins[0], params.get("rounding_method", 0))]
        elif name in _NUMPY:
            outs = [_NUMPY[name](*ins)]
        else:
            raise _Unevaluable(name)
        env.update(zip(eqn.outvars, outs))
    return [read(v) for v in jaxpr.outvars]


def value_at(schedule, step: int):
    """The schedule's value at `step`, computed without a device; None if it uses an
    operation this does not evaluate (its shape is still checked by `check`)."""
    closed = jax.make_jaxpr(schedule)(jax.ShapeDtypeStruct((), jnp.int32))
    try:
        (value,) = _evaluate(closed.jaxpr, closed.consts, [np.int32(step)])
    except _Unevaluable:
        return None
    return float(np.asarray(value))


def check(key: str, schedule, target: str):
    """Refuses, before anything compiles, a built `_target_` node that is not a schedule: not
    callable with the step, not one real number per step, or not positive at step 0.

    Args:
        key: the config key (`optimizer.learning_rate`), named in the error.
        schedule: what the node's `_target_` returned.
        target: the node's `_target_`, named in the error.

    Raises:
        ConfigError: one sentence naming `key`.
    """
    if not callable(schedule):
        raise ConfigError(key, f"must be a number or a schedule, a function of the step ({EXAMPLE}); "
                               f"{target} gave a {type(schedule).__name__}, which is not a function of the step")
    step = jax.ShapeDtypeStruct((), jnp.int32)
    try:
        out = jax.eval_shape(schedule, step)
    except Exception as err:  # noqa: BLE001 - any failure of a user's function is a config error
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ConfigError(key, f"must be a schedule, a function of the step ({EXAMPLE}); "
                               f"{target} cannot be called with the step ({reason})") from None
    if (not hasattr(out, "shape") or out.shape != ()
            or not (jnp.issubdtype(out.dtype, jnp.floating) or jnp.issubdtype(out.dtype, jnp.integer))):
        raise ConfigError(key, f"must be a schedule giving one real number per step; {target} gives "
                               f"{getattr(out, 'dtype', type(out).__name__)}{list(getattr(out, 'shape', []))}")
    value = value_at(schedule, 0)
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ConfigError(key, f"must be a schedule with a positive value at step 0 ({target} gives {value:g})")
