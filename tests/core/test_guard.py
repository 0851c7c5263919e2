"""reject_jump: a step whose energy estimate jumps above the last accepted one is undone."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from runner import app
from runner.config.build import build
from runner.core.guard import _guarded
from runner.core.stats import Stats
from runner.core.vmc import init_state, vmc_step
from runner.errors import ConfigError
from runner.parallel import mesh
from tests.helpers.config import compose_config
from tests.helpers.parallel import execute_on_devices
from tests.helpers.runs import assert_identical_runs, energies

CASE = ["hilbert.L=8", "model=rbm", "sampler.n_samples=256", "sampler.n_chains=8", "final_rounds=1", "exact=false",
        "checkpoint_every=100"]


def _problem(*overrides):
    experiment = build(compose_config([*CASE, *overrides]))
    return experiment.problem


def _step(problem):
    return jax.jit(lambda s: vmc_step(problem, s))


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


def _assert_same(a, b):
    for x, y in zip(_leaves(a), _leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)


def test_a_jump_is_undone_and_the_next_update_halved():
    """After an accepted step, a step whose estimate lies far above the accepted one goes back to
    where the accepted step started (parameters, optimizer, preconditioner), logs rejected = 1
    and halves the factor; the next step measures the kept state again and is not rejected, its
    update is exactly half the unscaled one (sgd), and the factor is back at 1."""
    problem = _problem("reject_jump=3")
    step = _step(problem)
    sigma_N = jnp.ones((8,), jnp.int8)
    start = init_state(problem, 0, sigma_N)
    first, metrics = step(start)
    assert int(metrics["rejected"]) == 0 and float(metrics["step_scale"]) == 1.0  # nothing to compare with yet
    assert float(first.guard.energy) == float(metrics["energy"])
    _assert_same(first.guard.params, start.params)
    # Pretend the accepted estimate was far lower than what the next samples will show.
    low = first._replace(guard=first.guard._replace(energy=first.guard.energy - 100.0))
    back, metrics = step(low)
    assert int(metrics["rejected"]) == 1 and float(back.guard.scale) == 0.5
    _assert_same(back.params, start.params)
    _assert_same(back.opt_state, start.opt_state)
    assert int(back.step) == 2  # the step counts; its parameters do not
    # The retry measures the kept parameters again: never rejected (the reference is still the
    # far lower one), its estimate the new reference, its update half the unscaled one.
    halved, metrics = step(back)
    assert int(metrics["rejected"]) == 0 and float(metrics["step_scale"]) == 0.5
    assert float(halved.guard.energy) == float(metrics["energy"]) > float(low.guard.energy) + 50
    full, _ = step(back._replace(guard=back.guard._replace(scale=jnp.ones_like(back.guard.scale),
                                                           energy=first.guard.energy)))
    for h, f, p in zip(_leaves(halved.params), _leaves(full.params), _leaves(back.params), strict=True):
        np.testing.assert_allclose(h - p, (f - p) / 2, rtol=1e-12, atol=1e-15)
    assert float(halved.guard.scale) == 1.0


@pytest.mark.parametrize("energy, error, variance", [
    (np.nan, 0.1, 1.0), (-1.0, np.inf, 1.0), (-1.0, 0.1, np.inf), (np.inf, np.inf, np.inf)])
def test_an_estimate_that_is_not_finite_is_a_jump(energy, error, variance):
    """A step whose energy, error bar or variance is not finite (a 6 x 6 run's step 572: E = -37.6
    +- 1.4 with an overflowed variance) is rejected like a jump, unless it measures the kept state
    again after a rejection (the run then stops on it)."""
    problem = _problem("reject_jump=3")
    state = init_state(problem, 0, jnp.ones((8,), jnp.int8))
    state = state._replace(guard=state.guard._replace(energy=jnp.float64(-1.0), error=jnp.float64(0.1)))
    stats = Stats(jnp.float64(energy), jnp.float64(error), jnp.float64(variance), jnp.float64(0.0), jnp.float64(1.0))
    moved = state._replace(params=jax.tree_util.tree_map(lambda x: x + 1, state.params))
    _, guarded = _guarded(3.0, state, moved, stats)
    assert int(guarded["rejected"]) == 1
    remeasuring = state._replace(guard=state.guard._replace(scale=jnp.float64(0.5)))
    _, guarded = _guarded(3.0, remeasuring, moved, stats)
    assert int(guarded["rejected"]) == 0
    fine = Stats(jnp.float64(-1.1), jnp.float64(0.1), jnp.float64(1.0), jnp.float64(0.0), jnp.float64(1.0))
    assert int(_guarded(3.0, state, moved, fine)[1]["rejected"]) == 0


@pytest.mark.parametrize("error, rejected", [(0.05, 0), (0.29, 0), (0.31, 1), (515.0, 1)])
def test_an_error_bar_k_times_the_last_one_is_a_jump(error, rejected):
    """A step whose estimate is lower but whose error bar is more than k times the last accepted
    one's (a tail of local energies the update opened: -71.54 +- 0.08, then -545 +- 515 on a 6 x 6
    J1-J2 run whose chains then froze) is rejected; at most k times is not."""
    problem = _problem("reject_jump=3")
    state = init_state(problem, 0, jnp.ones((8,), jnp.int8))
    state = state._replace(guard=state.guard._replace(energy=jnp.float64(-1.0), error=jnp.float64(0.1)))
    stats = Stats(jnp.float64(-2.0), jnp.float64(error), jnp.float64(1.0), jnp.float64(0.0), jnp.float64(1.0))
    moved = state._replace(params=jax.tree_util.tree_map(lambda x: x + 1, state.params))
    assert int(_guarded(3.0, state, moved, stats)[1]["rejected"]) == rejected


@pytest.mark.slow
def test_without_a_jump_the_guard_changes_no_bit(tmp_path):
    """With a threshold no step reaches, the run is the same bits as without the guard."""
    base = build(compose_config([*CASE, "n_iter=8"]))
    guarded = build(compose_config([*CASE, "n_iter=8", "reject_jump=1e6"]))
    app.execute(base, mesh.make_mesh("single"), tmp_path / "plain")
    app.execute(guarded, mesh.make_mesh("single"), tmp_path / "guarded")
    np.testing.assert_array_equal(energies(tmp_path / "guarded"), energies(tmp_path / "plain"))
    records = [json.loads(line) for line in (tmp_path / "guarded" / "metrics.jsonl").open()]
    assert all(r["rejected"] == 0 and r["step_scale"] == 1.0 for r in records)


@pytest.mark.slow
def test_a_run_with_rejections_is_identical_on_every_layout_and_resumes_exactly(tmp_path):
    """A threshold low enough that noise trips it (k = 0.05): some steps are rejected, and the
    run is the same bits on 1 and 4 devices and when stopped at step 6 and resumed (the guard is
    in the checkpoint)."""
    experiment = build(compose_config([*CASE, "n_iter=12", "reject_jump=0.05"]))
    execute_on_devices(experiment, tmp_path, (1, 4))
    records = [json.loads(line) for line in (tmp_path / "devices1" / "metrics.jsonl").open()]
    rejected = [r["step"] for r in records if r["rejected"]]
    assert 0 < len(rejected) < len(records), rejected
    after = [records[i + 1] for i, r in enumerate(records[:-1]) if r["rejected"]]
    assert all(r["step_scale"] == 0.5 and not r["rejected"] for r in after)  # the kept state, measured again
    assert_identical_runs(tmp_path / "devices4", tmp_path / "devices1")
    short = dataclasses.replace(experiment, settings=dataclasses.replace(experiment.settings, n_iter=6))
    app.execute(short, mesh.make_mesh("single"), tmp_path / "resumed")
    app.execute(experiment, mesh.make_mesh("single"), tmp_path / "resumed")
    assert_identical_runs(tmp_path / "resumed", tmp_path / "devices1")


SCHEDULE = "{_target_:optax.linear_schedule,init_value:0.02,end_value:0.002,transition_steps:12}"


def test_a_schedule_reads_the_count_the_rejections_took_back(tmp_path):
    """With a learning-rate schedule, a rejected step takes the optimizer, and with it the count its
    schedule reads, back to where the last accepted step started: the schedule reads the VMC step
    less two per rejection (the undone update and the dropped one), and the logged learning rate
    follows that count, step by step."""
    experiment = build(compose_config([*CASE, "n_iter=12", "reject_jump=0.05", f"optimizer.learning_rate={SCHEDULE}"]))
    app.execute(experiment, mesh.make_mesh("single"), tmp_path / "run")
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert 0 < sum(r["rejected"] for r in records) < len(records)
    schedule = optax.linear_schedule(0.02, 0.002, 12)
    count, started, expected = 0, 0, []  # the count at this step and at the start of the one before
    for record in records:
        expected.append(float(schedule(count)))
        count, started = (started if record["rejected"] else count + 1), count
    assert count == len(records) - 2 * sum(r["rejected"] for r in records)
    np.testing.assert_allclose([r["learning_rate"] for r in records], expected, rtol=1e-6)


def two_schedules(learning_rate):
    """An optimizer with two optax schedule counts (the runner cannot tell which one is the learning rate's)."""
    return optax.chain(optax.sgd(learning_rate), optax.scale_by_schedule(lambda count: 1.0))


@pytest.mark.parametrize("override, message", [
    (["reject_jump=0"], "must be a positive number"),
    (["reject_jump=-1"], "must be a positive number"),
    (["reject_jump=3", f"optimizer.learning_rate={SCHEDULE}", "optimizer._target_=tests.core.test_guard.two_schedules"],
     "one ScaleByScheduleState"),
    (["reject_jump=3", "sampler=full_sum"], "full_sum"),
])
def test_refused_at_build(override, message):
    with pytest.raises(ConfigError, match=message) as err:
        build(compose_config(["hilbert.L=6", *override]))
    assert err.value.key == "reject_jump"
