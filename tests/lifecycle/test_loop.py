"""runner.lifecycle.loop: the one loop every task runs in, driven here by fake programs (no compilation): a
stop during compilation takes no unit, a non-finite estimate stops the run and drops its state, a step that
reject_jump rejected does not, checkpoints follow the cadence and a stop, and the three tasks are one type."""

import json
import os
import signal
import time
import types

import numpy as np
import pytest

from runner.config.task import Dynamics, Excited, GroundState
from runner.lifecycle import dynamics, excited, ground_state, loop, tasks
from runner.lifecycle.preemption import StopRequest

GOOD = {"energy": np.float32(-1.0), "energy_error": np.float32(0.1), "variance": np.float32(1.0),
        "acceptance": np.float32(0.5)}


def _experiment(n_iter, checkpoint_every=10):
    settings = types.SimpleNamespace(n_iter=n_iter, checkpoint_every=checkpoint_every, seed=0)
    sampler = types.SimpleNamespace()  # not a Metropolis sampler: no collapse check
    return types.SimpleNamespace(settings=settings, hilbert=types.SimpleNamespace(n_sites=4),
                                 problem=types.SimpleNamespace(sampler=sampler))


def _task(feed, saved, compiled=None, holds=None):
    """A ground-state-shaped task whose 'state' is the number of steps taken and whose steps'
    metrics come from `feed`; checkpoints go to `saved` (label, state)."""

    def save(run_dir, state, settings, done):
        saved.append((done, state))
        return done

    def init(experiment, layout, run_dir, resuming, sweep_dir):
        return loop.Begun(0, None, 0, experiment.settings.n_iter, "metrics.jsonl",
                          experiment.settings.checkpoint_every, "step", save)

    def compile(experiment, layout, begun):
        if compiled is not None:
            compiled()

        def units(state, first, stop):
            for step in range(first, begun.n_units):
                state = state + 1
                yield loop.Unit(step, state, next(feed))

        bar = ground_state.tqdm(disable=True)
        return loop.Program(units, 0.0, where=lambda state, done: f"step {done}", show=ground_state.shows(bar, 1))

    def finish(experiment, layout, run_dir, ended):
        return loop.Finished({"status": ended.status, "reason": ended.reason, "state": ended.state})

    if holds is None:
        return loop.Task("fake", init, compile, ground_state.record, finish)
    return loop.Task("fake", init, compile, ground_state.record, finish, holds)


def _run(tmp_path, task, n_iter, checkpoint_every=10, signum=None):
    with StopRequest() as stop:
        if signum is not None:
            os.kill(os.getpid(), signum)
        return loop.run(task, _experiment(n_iter, checkpoint_every), None, tmp_path, False, stop=stop,
                        started=time.perf_counter())


def _records(tmp_path):
    return [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]


def test_a_stop_during_compilation_takes_no_step(tmp_path):
    saved = []
    task = _task(iter([]), saved, compiled=lambda: os.kill(os.getpid(), signal.SIGTERM))
    summary = _run(tmp_path, task, 5)
    assert summary == {"status": "preempted", "reason": "SIGTERM received before the first step", "state": 0}
    assert saved == [] and _records(tmp_path) == []


def test_a_stop_before_compilation_compiles_nothing(tmp_path):
    compiled = []
    summary = _run(tmp_path, _task(iter([]), [], compiled=lambda: compiled.append(1)), 5, signum=signal.SIGTERM)
    assert compiled == [] and summary["reason"] == "SIGTERM received before the first step"


def test_checkpoints_follow_the_cadence_and_the_last_step(tmp_path):
    saved = []
    summary = _run(tmp_path, _task(iter([GOOD] * 7), saved), 7, checkpoint_every=3)
    assert summary["status"] == "completed" and summary["state"] == 7
    assert saved == [(3, 3), (6, 6), (7, 7)]
    assert [r["step"] for r in _records(tmp_path)] == list(range(7))
    assert all(r["wall_time"] > 0 for r in _records(tmp_path))


FROZEN = {**GOOD, "acceptance": np.float32(0.0), "r_hat": np.float32(2.0)}


def test_a_checkpoint_due_while_the_chains_freeze_waits(tmp_path):
    """A checkpoint that comes due at a step whose acceptance is below ACCEPTANCE_LOW waits for the
    first step after it that is not (ground_state.holds); the last step is always saved."""
    saved = []
    feed = iter([GOOD] * 4 + [FROZEN] * 3 + [GOOD] * 3)
    summary = _run(tmp_path, _task(feed, saved, holds=ground_state.holds), 10, checkpoint_every=3)
    assert summary["status"] == "completed" and saved == [(3, 3), (8, 8), (9, 9), (10, 10)]


def test_a_run_that_collapses_keeps_the_checkpoint_from_before_the_collapse(tmp_path, caplog):
    """A 6 x 6 J1-J2 run froze at step 37 and failed as collapsed at step 56 saying "the last good
    checkpoint is step 50", written while it froze: now the checkpoints due during the collapse
    wait, and the one kept is from before it."""
    saved = []
    feed = iter([GOOD] * 5 + [FROZEN] * 25)
    with caplog.at_level("INFO", logger="runner"):
        summary = _run(tmp_path, _task(feed, saved, holds=ground_state.holds), 30, checkpoint_every=5)
    assert summary["status"] == "failed" and summary["reason"].startswith("collapsed")
    assert saved == [(5, 5)] and "the last good checkpoint is step 5" in caplog.text


def test_a_finite_energy_with_a_non_finite_variance_stops_the_run(tmp_path, caplog):
    """A 6x6 probe's step 129 had E = 1.2e15 with an overflowed variance (null in metrics.jsonl): the
    run must stop as on a NaN energy, not go on (it crashed formatting the progress bar)."""
    bad = {**GOOD, "energy": np.float32(1.2e15), "energy_error": np.float32(np.inf), "variance": np.float32(np.inf)}
    saved = []
    with caplog.at_level("INFO", logger="runner"):
        summary = _run(tmp_path, _task(iter([GOOD, GOOD, bad, GOOD]), saved), 4)
    assert (summary["state"], summary["status"]) == (2, "failed")  # the state after the bad step is dropped
    assert summary["reason"] == "energy is 1.2e+15 with variance inf, energy_error inf at step 2"
    assert "no checkpoint was written" in caplog.text and saved == []
    assert [r["variance"] for r in _records(tmp_path)] == [1.0, 1.0, None]


@pytest.mark.parametrize("rejected, expected", [(1, (4, "completed")), (0, (1, "failed"))])
def test_a_rejected_step_with_a_non_finite_variance_does_not_stop_the_run(tmp_path, caplog, rejected, expected):
    """A step that reject_jump rejected is dropped anyway: its unusable estimate is logged (null in
    metrics.jsonl) and the run goes on; an unusable step the guard kept stops it as before."""
    good = {**GOOD, "rejected": np.int32(0)}
    unusable = {**good, "energy": np.float32(-0.5), "variance": np.float32(np.inf), "rejected": np.int32(rejected)}
    with caplog.at_level("INFO", logger="runner"):
        summary = _run(tmp_path, _task(iter([good, unusable, good, good]), []), 4)
    assert (summary["state"], summary["status"]) == expected
    assert _records(tmp_path)[1]["variance"] is None
    if rejected:
        assert "energy is -0.5 with variance inf at step 1; rejected (reject_jump)" in caplog.text


def test_every_task_is_a_task_of_the_one_loop():
    """The config's task types, never None, each map onto one `loop.Task` with the four functions."""
    assert tasks.of(GroundState()) is ground_state.TASK
    assert tasks.of(Excited(n_states=2)) is excited.TASK
    assert tasks.TASKS[Dynamics] is dynamics.TASK
    for task in tasks.TASKS.values():
        assert isinstance(task, loop.Task) and all(callable(f) for f in task[1:])
