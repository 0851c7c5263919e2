"""Runge-Kutta integrators on y' = A y (complex, a pytree of two leaves) against exp(A t): orders
of accuracy, adaptive steps within tolerance, one compilation for a whole adaptive run."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

from runner.core import integrators as ig
from runner.errors import ConfigError

A = np.array([[-0.1 + 1.0j, 0.4, 0.2j], [-0.3, -0.2 - 0.5j, 0.6], [0.1j, -0.5, 0.3j]])
Y0 = np.array([1.0, 0.5 - 0.5j, -0.2j])
T = 1.0
NO_CALLS = np.zeros((), np.int32)  # the carry: f counts its evaluations (typed, as a run's state would be)


def to_tree(v):
    return {"u": v[:1], "v": v[1:]}


def from_tree(y):
    return jnp.concatenate([y["u"], y["v"]])


def linear(t, y, n_calls):
    """f(t, y, carry): A y, counting its evaluations in the carry."""
    return to_tree(jnp.asarray(A) @ from_tree(y)), n_calls + 1


def exact(t):
    return scipy.linalg.expm(A * t) @ Y0


def solve(integrator, t_end=T):
    """(y(t_end) [3], final state), by one jitted `advance`."""
    state = ig.init(integrator, linear, 0.0, to_tree(jnp.asarray(Y0)), NO_CALLS)
    y, state = jax.jit(lambda y, s: ig.advance(integrator, linear, y, s, t_end))(to_tree(jnp.asarray(Y0)), state)
    return np.asarray(from_tree(y)), state


def fixed_step(name, dt):
    """The method at constant step dt: an adaptive pair with dt_min = dt_max = dt and a
    tolerance every step meets."""
    if name in ("rk23", "rk45"):
        return getattr(ig, name)(dt, atol=1e10, rtol=0.0, dt_min=dt, dt_max=dt)
    return getattr(ig, name)(dt)


def fitted_order(dts, errors):
    return np.polyfit(np.log(dts), np.log(errors), 1)[0]


ORDERS = {"euler": (1, (32, 64, 128, 256)), "heun": (2, (16, 32, 64, 128)), "rk4": (4, (8, 16, 32, 64)),
          "rk23": (3, (16, 32, 64, 128)), "rk45": (5, (4, 8, 16, 32))}


@pytest.mark.parametrize("name", sorted(ORDERS))
def test_global_order_of_accuracy(name):
    """The global error at T of n equal steps, n doubled: the fitted order within 0.3 of the
    method's (rk23, rk45: of the solution they carry forward, 3 and 5)."""
    order, counts = ORDERS[name]
    dts = [T / n for n in counts]
    errors = []
    for n, dt in zip(counts, dts):
        y, state = solve(fixed_step(name, dt))
        assert float(state.t) == T and int(state.n_accepted) == n and int(state.n_rejected) == 0
        errors.append(np.linalg.norm(y - exact(T)))
    fitted = fitted_order(dts, errors)
    print(f"{name}: errors {[f'{e:.2e}' for e in errors]}, fitted order {fitted:.3f}")
    assert abs(fitted - order) < 0.3, (fitted, errors)


@pytest.mark.parametrize("name,order_low", [("rk23", 2), ("rk45", 4)])
def test_embedded_error_estimate_has_the_embedded_order(name, order_low):
    """The error estimate of one step scales as dt^(order_low + 1): the local error of the
    embedded solution."""
    tableau = getattr(ig, name.upper())
    dts = [0.2, 0.1, 0.05, 0.025]
    sizes = []
    for dt in dts:
        integrator = fixed_step(name, dt)
        state = ig.init(integrator, linear, 0.0, to_tree(jnp.asarray(Y0)), NO_CALLS)
        _, err, _, _ = ig._attempt(tableau, linear, state.t, to_tree(jnp.asarray(Y0)), dt, state)
        sizes.append(float(np.linalg.norm(np.asarray(from_tree(err)))))
    assert abs(fitted_order(dts, sizes) - (order_low + 1)) < 0.3


@pytest.mark.parametrize("name", ["rk23", "rk45"])
def test_adaptive_steps_meet_the_tolerance(name):
    """From a first step far too long (rejected), the controller settles on steps whose global
    error at T = 4 stays within a few tolerances, and a tighter tolerance takes more steps
    and gives a smaller error."""
    errors, steps = [], []
    for tol in (1e-5, 1e-8):
        integrator = getattr(ig, name)(1.0, atol=tol, rtol=tol, dt_min=1e-6, dt_max=2.0)
        y, state = solve(integrator, t_end=4.0)
        assert float(state.t) == 4.0
        assert int(state.n_rejected) >= 1
        error = np.max(np.abs(y - exact(4.0)))
        print(f"{name} tol {tol:.0e}: {int(state.n_accepted)} steps, {int(state.n_rejected)} rejected, "
              f"error {error:.2e}, evaluations {int(state.carry)}")
        assert error < 30 * tol
        errors.append(error)
        steps.append(int(state.n_accepted))
    assert errors[1] < errors[0] and steps[1] > steps[0]


@pytest.mark.parametrize("name", ["rk23", "rk45"])
def test_every_accepted_step_is_within_tolerance(name):
    """Step by step: the true local error of each accepted step (against exp(A dt) of the
    step's start) has `error_norm` at most 1; rejected steps leave t and y unchanged."""
    tol = 1e-6
    integrator = getattr(ig, name)(0.8, atol=tol, rtol=tol, dt_min=1e-6, dt_max=2.0)
    y = to_tree(jnp.asarray(Y0))
    state = ig.init(integrator, linear, 0.0, y, NO_CALLS)
    one_step = jax.jit(lambda y, s: ig.step(integrator, linear, y, s))
    norms = []
    for _ in range(40):
        new_y, new_state = one_step(y, state)
        if int(new_state.n_accepted) > int(state.n_accepted):
            dt = float(new_state.t - state.t)
            truth = to_tree(jnp.asarray(scipy.linalg.expm(A * dt) @ np.asarray(from_tree(y))))
            err = jax.tree_util.tree_map(jnp.subtract, new_y, truth)
            norms.append(float(ig.error_norm(err, y, new_y, tol, tol)))
        else:
            assert float(new_state.t) == float(state.t) and new_state.dt < state.dt
            np.testing.assert_array_equal(np.asarray(from_tree(new_y)), np.asarray(from_tree(y)))
        y, state = new_y, new_state
    assert int(state.n_rejected) >= 1 and len(norms) > 20
    assert max(norms) <= 1.0, max(norms)


def test_fsal_reuses_the_last_stage():
    """Dormand-Prince evaluates f 6 times per attempted step, plus once in init."""
    integrator = ig.rk45(0.05, atol=1e-8, rtol=1e-8, dt_min=1e-6, dt_max=0.5)
    _, state = solve(integrator)
    attempts = int(state.n_accepted) + int(state.n_rejected)
    assert int(state.carry) == 6 * attempts + 1


def test_an_adaptive_run_compiles_once():
    """Many adaptive steps with changing dt, and `advance` to 20 different save times, each
    compile once (counted as traces, which JAX makes once per compilation): dt, t and t_end are
    traced values."""
    integrator = ig.rk45(0.01, atol=1e-9, rtol=1e-9, dt_min=1e-6, dt_max=0.5)
    y = to_tree(jnp.asarray(Y0))
    state = ig.init(integrator, linear, 0.0, y, NO_CALLS)
    traces = []  # one entry per trace: JAX traces once per compilation

    def traced(fn):
        def counted(*args):
            traces.append(fn)
            return fn(*args)
        return jax.jit(counted)

    one_step = traced(lambda y, s: ig.step(integrator, linear, y, s))
    dts = set()
    for _ in range(30):
        y, state = one_step(y, state)
        dts.add(float(state.dt))
    assert len(dts) > 5 and len(traces) == 1

    traces.clear()
    to_time = traced(lambda y, s, t_end: ig.advance(integrator, linear, y, s, t_end))
    y, state = to_tree(jnp.asarray(Y0)), ig.init(integrator, linear, 0.0, to_tree(jnp.asarray(Y0)), NO_CALLS)
    for t_save in np.linspace(0.1, 2.0, 20):
        y, state = to_time(y, state, t_save)
        assert float(state.t) == t_save
        np.testing.assert_allclose(np.asarray(from_tree(y)), exact(t_save), atol=1e-7)
    assert len(traces) == 1


def test_save_times_do_not_shrink_the_step():
    """Fixed steps to save times that are multiples of dt land on them in exactly that many
    steps (no sliver step from rounding), and an adaptive step shortened to land on a save
    time hands its longer step size on."""
    integrator = ig.rk4(0.1)
    y, state = to_tree(jnp.asarray(Y0)), ig.init(integrator, linear, 0.0, to_tree(jnp.asarray(Y0)), NO_CALLS)
    advance = jax.jit(lambda y, s, t_end: ig.advance(integrator, linear, y, s, t_end))
    for k in range(1, 8):
        y, state = advance(y, state, 0.3 * k)
        assert int(state.n_accepted) == 3 * k and float(state.t) == 0.3 * k

    adaptive = ig.rk45(0.4, atol=1e-3, rtol=1e-3, dt_min=1e-6, dt_max=0.4)
    y, state = to_tree(jnp.asarray(Y0)), ig.init(adaptive, linear, 0.0, to_tree(jnp.asarray(Y0)), NO_CALLS)
    y, state = jax.jit(lambda y, s: ig.step(adaptive, linear, y, s, 0.05))(y, state)
    assert float(state.t) == 0.05 and float(state.dt) >= 0.4 - 1e-12


def test_state_is_a_plain_pytree_that_resumes():
    """The state's leaves are arrays: copied to NumPy and back, the run continues bit for bit."""
    integrator = ig.rk23(0.1, atol=1e-6, rtol=1e-6, dt_min=1e-6, dt_max=1.0)
    advance = jax.jit(lambda y, s, t_end: ig.advance(integrator, linear, y, s, t_end))
    y, state = advance(to_tree(jnp.asarray(Y0)), ig.init(integrator, linear, 0.0, to_tree(jnp.asarray(Y0)), NO_CALLS), 0.5)
    saved = jax.tree_util.tree_map(np.asarray, (y, state))
    straight = advance(y, state, 1.0)
    resumed = advance(*jax.tree_util.tree_map(jnp.asarray, saved), 1.0)
    for a, b in zip(jax.tree_util.tree_leaves(straight), jax.tree_util.tree_leaves(resumed)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_float32_trees_stay_float32():
    integrator = ig.rk45(0.1, atol=1e-5, rtol=1e-5, dt_min=1e-6, dt_max=1.0)
    f = lambda t, y, c: (jax.tree_util.tree_map(lambda x: -x, y), c)  # noqa: E731
    y0 = {"a": jnp.ones(3, jnp.float32), "b": jnp.ones(2, jnp.complex64)}
    y, _ = ig.advance(integrator, f, y0, ig.init(integrator, f, 0.0, y0), 1.0)
    assert y["a"].dtype == jnp.float32 and y["b"].dtype == jnp.complex64
    np.testing.assert_allclose(np.asarray(y["a"]), np.exp(-1.0), rtol=1e-4)


def test_refuses_bad_settings():
    with pytest.raises(ConfigError, match="dt"):
        ig.rk4(0.0)
    with pytest.raises(ConfigError, match="atol"):
        ig.rk45(0.1, atol=0.0, rtol=0.0, dt_min=1e-3, dt_max=1.0)
    with pytest.raises(ConfigError, match="dt_min"):
        ig.rk23(0.1, atol=1e-6, rtol=1e-6, dt_min=1.0, dt_max=0.5)
    with pytest.raises(ConfigError, match="dt"):
        ig.rk23(2.0, atol=1e-6, rtol=1e-6, dt_min=1e-3, dt_max=1.0)
