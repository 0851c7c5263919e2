"""task=dynamics with task/integrator=ptvmc: the quench against the exact dynamics through `runner.run`,
a sampled run stopped between saved times and resumed bit for bit, and a bad key refused by the CLI."""

import json
import time

import numpy as np
import pytest

import runner
from runner import app
from runner.config.build import build
from runner.lifecycle import checkpoint, loop
from runner.lifecycle import dynamics as dyn
from runner.parallel import mesh
from tests.helpers.cli import REPO, run_cli
from tests.helpers.config import compose_config
from tests.helpers.runs import QUENCH, StopAfterSaved, checkpoint_leaves, trajectory

PTVMC = [*QUENCH, "task/integrator=ptvmc"]
# Sampled: 8 chains of 16 samples per draw, two projected steps between saved times.
SAMPLED = [*PTVMC, "sampler=metropolis_local", "sampler.n_samples=128", "sampler.n_chains=8",
           "task.integrator.dt=0.05", "task.integrator.max_iterations=3", "exact=false"]


@pytest.mark.slow
def test_quench_follows_exact_dynamics(tmp_path):
    """The 6-site TFIM quench from plus_x to h = 0.5 (complex Jastrow, full sum) by projected steps of
    dt = 0.02 to t = 0.5, run by `runner.run`: M_x within 1e-3 of exp(-i H t) (measured 7.3e-4: the
    midpoint rule's O(dt^2) error, 1.7e-4 at dt = 0.01, on top of the ansatz's 2.7e-4 that rk4 shows),
    the Y Z correlator within 2e-2 (as rk4's test), the energy within 2e-4 (1.1e-4); each saved time
    records the last step's infidelity (the ansatz's floor, 2.2e-5 at t = 0.5) and the updates so
    far; trajectory.jsonl, summary.json, exact_trajectory.json, dynamics.png and the checkpoint as an
    rk4 run writes them, and the run loads at t = 0.5."""
    trained = runner.run([*PTVMC, "sampler=full_sum", "task.t_end=0.5", "task.integrator.dt=0.02"], tmp_path,
                         quiet=True)
    records = trajectory(tmp_path)
    np.testing.assert_allclose([r["t"] for r in records], [0.0, 0.1, 0.2, 0.3, 0.4, 0.5], atol=1e-12)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["n_steps"] == 25 and summary["n_rejected"] == 0
    errors = summary["max_abs_error"]
    assert errors["obs/mx"] < 1e-3 and errors["obs/yz"] < 2e-2 and errors["energy"] < 2e-4, errors
    assert records[0]["infidelity"] is None and records[0]["n_iterations"] == 0
    assert all(0 < r["infidelity"] < 1e-4 for r in records[1:])
    assert summary["infidelity"] == records[-1]["infidelity"]
    iterations = [r["n_iterations"] for r in records]
    assert iterations == sorted(iterations) and 25 <= iterations[-1] <= 25 * 3  # converged in 1 to 3 updates
    assert {*records[0]} - {"infidelity", "n_iterations"} == {*trajectory_keys_of_rk4()}
    for name in ("exact_trajectory.json", "dynamics.png", "checkpoint"):
        assert (tmp_path / name).exists(), name
    assert trained.t == 0.5


def trajectory_keys_of_rk4():
    """The keys of an rk4 run's trajectory record (runner.lifecycle.dynamics.record) of this quench."""
    return ["t", "energy", "energy_error", "residual", "acceptance", "obs/mx", "obs/mx_error", "obs/yz",
            "obs/yz_error", "dt", "n_steps", "n_rejected"]


@pytest.mark.slow
def test_a_sampled_run_stopped_between_saved_times_resumes_bit_for_bit(tmp_path, monkeypatch):
    """Metropolis samples, steps of 0.05 to t = 0.3: stopped one step after the record at t = 0.1 (in
    calls of one step), the run checkpoints between saved times, and resumed (in calls of 16 steps)
    it gives the trajectory (infidelities and update counts included) and final checkpoint (the
    velocity of the last step included) of an uninterrupted run bit for bit."""
    overrides = [*SAMPLED, "task.t_end=0.3"]
    app.execute(build(compose_config(overrides)), mesh.make_mesh("single"), tmp_path / "whole")
    monkeypatch.setattr(dyn, "STEPS_PER_CALL", 1)
    (tmp_path / "parts").mkdir()
    stop = StopAfterSaved(tmp_path / "parts", index=1, looks=2)
    stopped = loop.run(dyn.TASK, build(compose_config(overrides)), mesh.make_mesh("single"), tmp_path / "parts", False,
                       stop=stop, started=time.perf_counter())
    assert stopped["status"] == "preempted" and stop.saved == 1
    meta = checkpoint.read_meta(tmp_path / "parts" / "checkpoint")
    assert meta["step"] == 1 and 0.1 < meta["t"] < 0.2, meta
    monkeypatch.setattr(dyn, "STEPS_PER_CALL", 16)
    app.execute(build(compose_config(overrides)), mesh.make_mesh("single"), tmp_path / "parts")
    records = trajectory(tmp_path / "whole")
    assert len(records) == 4 and all(r["infidelity"] is not None for r in records[1:])
    assert trajectory(tmp_path / "parts") == records  # (assert_same_run's float comparison cannot take t = 0's None)
    got, want = checkpoint_leaves(tmp_path / "parts"), checkpoint_leaves(tmp_path / "whole")
    assert got.keys() == want.keys() and got
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_cli_refuses_a_bad_key_in_one_sentence(tmp_path):
    """max_iterations = 0: exit 2 naming the key, before a run directory exists."""
    proc = run_cli([*PTVMC, "task.integrator.max_iterations=0", f"hydra.run.dir={tmp_path / 'run'}"], REPO)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0] == "Config error: task.integrator.max_iterations must be at least 1 (got 0)."
    assert not (tmp_path / "run").exists()
