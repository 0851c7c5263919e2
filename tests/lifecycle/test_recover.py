"""recover: a ground-state run that fails (a collapse, an estimate that is not finite) goes back to its last
good checkpoint with every later step scaled down (the guard's ceiling halved), at most `recover` times."""

import dataclasses
import json

import jax
import numpy as np
import pytest

from runner import app
from runner.config.build import build
from runner.config.task import GroundState
from runner.errors import ConfigError
from runner.lifecycle import ground_state, loop, tasks
from runner.parallel import mesh
from tests.helpers.config import compose_config
from tests.helpers.parallel import execute_on_devices
from tests.helpers.runs import assert_identical_runs

CASE = ["hilbert.L=8", "model=rbm", "sampler.n_samples=256", "sampler.n_chains=8", "final_rounds=1", "exact=false",
        "reject_jump=1e6", "peak_search=0"]


def _begun(experiment):
    state, shardings = ground_state.place_state(experiment.problem, experiment.settings, mesh.make_mesh("single"))
    return loop.Begun(state, shardings, 0, experiment.settings.n_iter, "metrics.jsonl", 10, "step", loop.save_steps)


def test_each_recovery_halves_the_ceiling_of_the_step_scale_until_recover_runs_out():
    """The guard holds a ceiling only with recover (a checkpoint of reject_jump alone is as before the key). The
    kept state comes back with the ceiling half the failing state's (scale in proportion: a
    state kept right after a rejection is still measured again); past 2^-recover, None (the run fails)."""
    experiment = build(compose_config([*CASE, "recover=2"]))
    begun = _begun(experiment)
    kept = begun.state._replace(guard=begun.state.guard._replace(scale=begun.state.guard.scale / 2))
    once = ground_state.recover(experiment, begun, kept, begun.state)
    assert (float(once.guard.ceiling), float(once.guard.scale)) == (0.5, 0.25)
    for a, b in zip(jax.tree_util.tree_leaves(once.params), jax.tree_util.tree_leaves(kept.params), strict=True):
        np.testing.assert_array_equal(a, b)
    twice = ground_state.recover(experiment, begun, kept, once)
    assert (float(twice.guard.ceiling), float(twice.guard.scale)) == (0.25, 0.125)
    assert ground_state.recover(experiment, begun, kept, twice) is None
    off = build(compose_config(CASE))
    alone = _begun(off).state
    assert alone.guard.ceiling == () and ground_state.recover(off, _begun(off), alone, alone) is None


def _failing_once_at(step):
    """The ground-state task whose `record` fails at `step` while the steps are at full size (a collapse there,
    made to order): a recovery takes the run back before it and scales the steps, and it does not fail again."""

    def record(experiment, unit, records):
        out, failure = ground_state.record(experiment, unit, records)
        if unit.index == step and out.get("step_ceiling", 1.0) == 1.0:
            failure = f"collapsed: made to order at step {step}"
        return out, failure

    return ground_state.TASK._replace(record=record)


@pytest.mark.slow
def test_a_recovered_run_is_identical_on_every_layout_and_resumes_exactly(tmp_path, monkeypatch, caplog):
    """A run failing at step 9 goes back to its checkpoint at step 8 and ends with its records from then
    on at half the step size, the same bits on 1 and 4 devices and when stopped at step 10 and resumed
    (the ceiling is in the checkpoint); its summary says so. With recover=null it fails there."""
    monkeypatch.setitem(tasks.TASKS, GroundState, _failing_once_at(9))
    experiment = build(compose_config([*CASE, "n_iter=12", "checkpoint_every=4", "recover=1"]))
    with caplog.at_level("WARNING", logger="runner"):
        execute_on_devices(experiment, tmp_path, (1, 4))
    assert "going back to step 8, where the last good checkpoint is (recover)" in caplog.text
    records = [json.loads(line) for line in (tmp_path / "devices1" / "metrics.jsonl").open()]
    assert [r["step"] for r in records] == list(range(12))
    assert [r["step_ceiling"] for r in records] == [1.0] * 8 + [0.5] * 4
    summary = json.loads((tmp_path / "devices1" / "summary.json").read_text())
    assert summary["status"] == "completed" and "recovered" in [w["name"] for w in summary["warnings"]]
    assert_identical_runs(tmp_path / "devices4", tmp_path / "devices1")
    short = dataclasses.replace(experiment, settings=dataclasses.replace(experiment.settings, n_iter=10))
    app.execute(short, mesh.make_mesh("single"), tmp_path / "resumed")
    app.execute(experiment, mesh.make_mesh("single"), tmp_path / "resumed")
    assert_identical_runs(tmp_path / "resumed", tmp_path / "devices1")
    plain = build(compose_config([*CASE, "n_iter=12", "checkpoint_every=4"]))
    with pytest.raises(app.RunFailed):
        app.execute(plain, mesh.make_mesh("single"), tmp_path / "plain")
    summary = json.loads((tmp_path / "plain" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["reason"] == "collapsed: made to order at step 9"


@pytest.mark.parametrize("override, message", [
    (["recover=0"], "must be at least 1"),
    (["recover=2", "reject_jump=null"], "needs reject_jump"),
    (["recover=2", "task=dynamics"], "task=ground_state only"),
])
def test_refused_at_build(override, message):
    with pytest.raises(ConfigError, match=message) as err:
        build(compose_config([*CASE, *override]))
    assert err.value.key == "recover"
