"""runner.config.schedules: learning-rate and diag_shift schedules from the config, the step they read
(also across a resume), their metrics, fingerprint and refusal of bad nodes."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from runner import app
from runner.config import schedules
from runner.config.build import build
from runner.core.precond_types import from_dense
from runner.core.vmc import init_state, vmc_step
from runner.errors import ConfigError
from runner.lifecycle import rundir
from runner.parallel import mesh
from tests.helpers.cli import REPO, run_cli
from tests.helpers.config import compose_config

RUN = ["hilbert.L=8", "sampler.n_samples=256", "sampler.n_chains=8", "final_rounds=1", "exact=false",
       "checkpoint_every=100", "preconditioner.solver=cholesky"]
LR = "{_target_:optax.cosine_decay_schedule,init_value:0.05,decay_steps:4,alpha:0.1}"
SHIFT = "{_target_:optax.exponential_decay,init_value:0.1,transition_steps:2,decay_rate:0.5,end_value:0.001}"
SCHEDULED = [f"optimizer.learning_rate={LR}", f"preconditioner.diag_shift={SHIFT}"]
CONSTANT = ["optimizer.learning_rate={_target_:optax.constant_schedule,value:0.02}",
            "preconditioner.diag_shift={_target_:optax.constant_schedule,value:0.01}"]


def records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def execute(overrides, run_dir):
    app.execute(build(compose_config([*RUN, *overrides])), mesh.make_mesh("single"), run_dir)
    return records(run_dir)


@pytest.mark.parametrize("schedule", [
    optax.cosine_decay_schedule(0.02, 1000, alpha=0.1),
    optax.exponential_decay(0.1, 100, 0.5, end_value=1e-3),
    optax.exponential_decay(0.1, 7, 0.5, staircase=True, end_value=1e-3),
    optax.warmup_cosine_decay_schedule(0.01, 0.1, 10, 100),
    optax.linear_schedule(0.1, 0.01, 100),
    optax.polynomial_schedule(0.1, 0.01, 2, 100),
    optax.piecewise_constant_schedule(0.1, {10: 0.5}),
    optax.constant_schedule(0.3),
], ids=["cosine", "exponential", "staircase", "warmup_cosine", "linear", "polynomial", "piecewise", "constant"])
def test_value_at_evaluates_optax_schedules_without_a_device(schedule):
    """The check of a schedule's value runs its jaxpr in NumPy (before the device is set up); it
    agrees with JAX's own evaluation at the int32 step optax and the preconditioner pass."""
    for step in (0, 3, 10, 57, 2000):
        expected = float(schedule(np.int32(step)))
        assert schedules.value_at(schedule, step) == pytest.approx(expected, rel=1e-6, abs=1e-12)


@pytest.mark.parametrize("override,message", [
    ("optimizer.learning_rate={_target_:optax.adam,learning_rate:0.1}", "is not a function of the step"),
    ("optimizer.learning_rate={_target_:optax.cosine_decay_schedule,init_value:-0.1,decay_steps:10}",
     "positive value at step 0 (optax.cosine_decay_schedule gives -0.1)"),
    ("preconditioner.diag_shift={_target_:optax.linear_schedule,init_value:0.0,end_value:0.1,transition_steps:5}",
     "positive value at step 0"),
    ("preconditioner.diag_shift={_target_:numpy.ones,shape:3}", "gave a ndarray"),
    ("optimizer.learning_rate={_target_:optax.linear_schedule,init_value:[0.1,0.2],end_value:0.0,transition_steps:5}",
     "optax.linear_schedule cannot be called with the step"),
    ("optimizer.learning_rate={_target_:optax.cosine_decay_schedule,init_valu:0.1,decay_steps:10}",
     "init_valu is not a key of optimizer.learning_rate"),
    ("optimizer.learning_rate={init_value:0.1}", "optimizer.learning_rate._target_ is missing"),
])
def test_a_bad_schedule_node_is_a_config_error(override, message):
    with pytest.raises(ConfigError) as err:
        build(compose_config([*RUN, override]))
    assert message in err.value.sentence(), err.value.sentence()
    assert err.value.sentence().startswith(override.split("=")[0].split("{")[0]), err.value.sentence()


def test_a_function_of_the_step_that_is_not_one_number_per_step_is_refused():
    with pytest.raises(ConfigError) as err:
        schedules.check("preconditioner.diag_shift", lambda step, other: step, "my.schedule")
    assert "my.schedule cannot be called with the step" in err.value.sentence()
    with pytest.raises(ConfigError) as err:
        schedules.check("preconditioner.diag_shift", lambda step: np.ones(3, np.float32) * step, "my.schedule")
    assert "giving one real number per step; my.schedule gives float32[3]" in err.value.sentence()
    schedules.check("preconditioner.diag_shift", lambda step: 0.5 + 0 * step, "my.schedule")  # accepted


def test_a_bad_schedule_node_stops_the_cli_with_one_sentence(tmp_path):
    proc = run_cli([*RUN, "optimizer.learning_rate={_target_:optax.exponential_decay,init_value:-1,"
                          "transition_steps:10,decay_rate:0.5}", f"hydra.run.dir={tmp_path}/run"], REPO)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("Config error: optimizer.learning_rate must be a schedule with a positive value")


@pytest.mark.slow
def test_each_step_uses_the_schedules_value_at_its_step():
    """Step k of a scheduled run is bitwise step k of a run with the numbers lr(k), diag_shift(k):
    the schedules are read at the VMC step, 0 at the first (optax's count for the lr)."""
    lr = optax.cosine_decay_schedule(0.05, 4, alpha=0.1)
    shift = optax.exponential_decay(0.1, 2, 0.5, end_value=0.001)
    scheduled = build(compose_config([*RUN, *SCHEDULED])).problem
    state = init_state(scheduled, 0, np.ones(8, np.int8))
    step = jax.jit(lambda s: vmc_step(scheduled, s))
    for k in range(3):
        plain_overrides = [f"optimizer.learning_rate={float(lr(jnp.int32(k)))!r}",
                           f"preconditioner.diag_shift={float(shift(jnp.int32(k)))!r}"]
        plain = build(compose_config([*RUN, *plain_overrides])).problem
        # the plain run's optimizer state is a different pytree: carry the scheduled run's parameters and chains
        plain_state = state._replace(opt_state=plain.optimizer.init(state.params), solver=())
        expected, _ = jax.jit(lambda s: vmc_step(plain, s))(plain_state)
        state, metrics = step(state)
        assert int(state.step) == k + 1
        assert float(metrics["learning_rate"]) == float(lr(jnp.int32(k)))
        assert float(metrics["diag_shift"]) == float(shift(jnp.int32(k)))
        for got, want in zip(jax.tree_util.tree_leaves(state.params), jax.tree_util.tree_leaves(expected.params)):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.slow
def test_metrics_carry_the_schedules_values_and_a_resumed_run_is_bitwise_the_same(tmp_path):
    whole = execute([*SCHEDULED, "n_iter=6"], tmp_path / "whole")
    lr = optax.cosine_decay_schedule(0.05, 4, alpha=0.1)
    shift = optax.exponential_decay(0.1, 2, 0.5, end_value=0.001)
    assert [r["learning_rate"] for r in whole] == [float(lr(jnp.int32(k))) for k in range(6)]
    assert [r["diag_shift"] for r in whole] == [float(np.float64(shift(jnp.int32(k)))) for k in range(6)]
    # interrupted after 3 steps (checkpoint at the end), then resumed to 6
    first = execute([*SCHEDULED, "n_iter=3"], tmp_path / "resumed")
    assert first == [{**r, "wall_time": f["wall_time"]} for r, f in zip(whole[:3], first)]
    resumed = execute([*SCHEDULED, "n_iter=6"], tmp_path / "resumed")
    strip = lambda rs: [{k: v for k, v in r.items() if k != "wall_time"} for r in rs]  # noqa: E731
    assert strip(resumed) == strip(whole)
    summary = lambda d: json.loads((d / "summary.json").read_text())  # noqa: E731
    assert summary(tmp_path / "resumed")["energy"] == summary(tmp_path / "whole")["energy"]


@pytest.mark.slow
def test_a_constant_schedule_is_bitwise_the_plain_number_and_adds_the_metrics(tmp_path):
    plain = execute(["n_iter=4", "optimizer.learning_rate=0.02", "preconditioner.diag_shift=0.01"], tmp_path / "plain")
    constant = execute([*CONSTANT, "n_iter=4"], tmp_path / "constant")
    assert [r["energy"] for r in constant] == [r["energy"] for r in plain]
    assert all("learning_rate" not in r and "diag_shift" not in r for r in plain)  # the record is unchanged
    assert all(r["learning_rate"] == 0.02 and r["diag_shift"] == 0.01 for r in constant)


def test_the_fingerprint_covers_the_schedule_nodes(tmp_path):
    """Resuming with another schedule value is refused, naming the nested key."""
    execute([*SCHEDULED, "n_iter=2"], tmp_path)
    other = LR.replace("alpha:0.1", "alpha:0.2")
    with pytest.raises(ConfigError) as err:
        rundir.check_run_dir(tmp_path, build(compose_config([*RUN, *SCHEDULED, f"optimizer.learning_rate={other}",
                                                             "n_iter=4"])).settings)
    assert err.value.key == "optimizer.learning_rate.alpha" and "0.2 in this config but 0.1" in err.value.sentence()


@pytest.mark.parametrize("preconditioner", ["sr", "minsr"])
@pytest.mark.parametrize("solver", ["cholesky", "cg"])
def test_every_preconditioner_reads_a_diag_shift_schedule(preconditioner, solver):
    """SR (dense and CG) and minSR solve with the schedule's value at the step they are given."""
    if preconditioner == "minsr" and solver == "cg":
        pytest.skip("minsr has no cg solver")
    from runner.core import precond

    rng = np.random.default_rng(0)
    Obar, eps = rng.normal(size=(12, 40)), rng.normal(size=40)
    jac = from_dense(Obar, "real")
    make = getattr(precond, preconditioner)
    extra = {"cg_tol": 1e-12} if solver == "cg" else {}
    shift = optax.exponential_decay(0.1, 2, 0.5)
    scheduled = make(diag_shift=shift, solver=solver, **extra)
    for step in (0, 3):
        plain = make(diag_shift=float(shift(jnp.int32(step))), solver=solver, **extra)
        state = scheduled.init(jax.ShapeDtypeStruct((12,), np.float64))
        x, _, info = scheduled.update(jac, eps, "real", state, jnp.int32(step))
        np.testing.assert_allclose(x, plain(jac, eps, "real"), rtol=1e-9)
        assert float(info["diag_shift"]) == float(shift(jnp.int32(step)))
