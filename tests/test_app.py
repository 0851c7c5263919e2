"""runner.app through the CLI: stop signals, failure reasons, health warnings, sweeps with a bad point."""

import json

import numpy as np
import pytest

from tests.conftest import REPO, run_cli

RUN = ["hilbert.L=8", "sampler.n_samples=256", "sampler.n_chains=8", "final_rounds=1", "exact=false",
       "checkpoint_every=100"]


def energies(run_dir):
    return [json.loads(line)["energy"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def summary_of(run_dir):
    return json.loads((run_dir / "summary.json").read_text())

# Stop signals, failure reasons, health warnings, sweeps with a bad point, run directories and the
# start-up header (APP-B)

import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

STOP = ["hilbert.L=12", "sampler.n_samples=512", "sampler.n_chains=8", "final_rounds=1", "n_iter=60",
        "checkpoint_every=50", "exact=false"]


def start_run(args, run_dir, cwd=REPO):
    return subprocess.Popen([sys.executable, "-m", "runner", *args, f"hydra.run.dir={run_dir}"], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(proc, condition, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if condition():
            return True
        time.sleep(0.005)
    return False


def log_says(run_dir, text):
    return lambda: any(text in p.read_text() for p in run_dir.glob("*.log"))


def metrics_lines(run_dir, n):
    path = run_dir / "metrics.jsonl"
    return lambda: path.exists() and len(path.read_text().splitlines()) >= n


def test_ctrl_c_checkpoints_at_the_next_step_and_exits_130(tmp_path):
    proc = start_run(STOP, tmp_path)
    assert wait_for(proc, metrics_lines(tmp_path, 12)), "the run ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    summary = summary_of(tmp_path)
    n_done = len(energies(tmp_path))
    assert summary["status"] == "interrupted" and 12 <= n_done < 60
    assert summary["reason"] == f"SIGINT received; stopped at step {n_done} after saving a checkpoint"
    with np.load(tmp_path / "checkpoint" / "state.npz") as data:  # no step lost since the last checkpoint
        assert json.loads(bytes(data["meta"]).decode())["step"] == n_done


def test_a_second_ctrl_c_aborts_at_once(tmp_path):
    proc = start_run(STOP, tmp_path)
    assert wait_for(proc, log_says(tmp_path, "run directory:"))
    proc.send_signal(signal.SIGINT)
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "Interrupted again" in stderr
    assert not (tmp_path / "summary.json").exists()


def test_sigterm_before_the_first_step_writes_a_preempted_summary(tmp_path):
    """The issue's `timeout -s TERM 5` during the exact diagonalisation or compilation: exit 3, not 143."""
    proc = start_run([*STOP, "exact=true"], tmp_path)
    assert wait_for(proc, log_says(tmp_path, "run directory:"))
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 3, stderr
    summary = summary_of(tmp_path)
    assert summary["status"] == "preempted" and summary["steps_done"] == 0
    assert summary["reason"] == "SIGTERM received before the first step"
    assert not (tmp_path / "checkpoint").exists()  # none existed; none is made up


def test_a_stop_during_compilation_takes_no_step(tmp_path):
    import os
    import types

    from runner import app
    from runner.preemption import StopRequest

    dispatched = []
    settings = types.SimpleNamespace(n_iter=5, checkpoint_every=2)
    metrics_log = app.MetricsLog(tmp_path / "metrics.jsonl", 0, started=time.perf_counter())
    with StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGTERM)  # arrives while XLA compiles; seen at the first boundary
        state, status, reason, step_times = app._optimize(dispatched.append, "initial", 0, settings, tmp_path,
                                                          metrics_log, stop)
    assert dispatched == [] and step_times == [] and state == "initial"
    assert (status, reason) == ("preempted", "SIGTERM received before the first step")
    assert not (tmp_path / "checkpoint").exists()


def test_an_exception_is_the_failure_reason(tmp_path):
    from runner import app

    app._write_failure(tmp_path, RuntimeError("boom\nsecond line"))
    assert summary_of(tmp_path)["status"] == "failed" and summary_of(tmp_path)["reason"] == "RuntimeError: boom"


def nan_run(tmp_path, caplog, overrides):
    from runner import app, parallel
    from runner.build import build
    from tests.test_config import compose_config

    experiment = build(compose_config(overrides))
    with caplog.at_level("INFO", logger="runner.app"), pytest.raises(SystemExit) as exit_info:
        app.execute(experiment, parallel.make_mesh("single"), tmp_path)
    return exit_info.value.code, caplog.text


def test_nan_failure_gives_its_reason_and_says_no_checkpoint_exists(tmp_path, caplog):
    code, text = nan_run(tmp_path, caplog, [*RUN, "n_iter=20", "optimizer.learning_rate=1e6"])
    summary = summary_of(tmp_path)
    n_done = len(energies(tmp_path))
    assert code == 1 and summary["status"] == "failed"
    assert summary["reason"] == f"energy is nan at step {n_done - 1}"
    assert "no checkpoint was written" in text and "last good checkpoint" not in text
    assert not (tmp_path / "checkpoint").exists()


def test_health_warnings_are_in_the_summary_and_printed(tmp_path, caplog):
    from runner import app, parallel
    from runner.build import build
    from tests.test_config import compose_config

    # two steps from random parameters: far from the exact energy; CG allowed 2 iterations a step
    experiment = build(compose_config([*RUN, "n_iter=2", "exact=true", "preconditioner.solver=cg",
                                       "preconditioner.cg_maxiter=2"]))
    with caplog.at_level("INFO", logger="runner.app"):
        summary = app.execute(experiment, parallel.make_mesh("single"), tmp_path)
    assert summary["relative_error"] > 0.1
    names = [w["name"] for w in summary["warnings"]]
    assert "relative_error" in names and "cg_maxiter" in names, summary["warnings"]
    assert summary_of(tmp_path)["warnings"] == summary["warnings"]
    assert "health warning [relative_error]" in caplog.text and "health warning [cg_maxiter]" in caplog.text


def test_sweep_records_a_bad_point_as_failed_and_runs_the_rest(tmp_path):
    proc = run_cli(["-m", *RUN, "n_iter=2", "sampler.n_chains=16", "sampler.n_samples=1000,256",
                    f"hydra.sweep.dir={tmp_path}"], REPO)
    assert proc.returncode == 2, proc.stderr  # the sweep ran on, and still says a point was bad
    bad, good = sorted(tmp_path.glob("*_*"))
    assert summary_of(bad) == {
        "status": "failed",
        "reason": "config error: sampler.n_samples must be a multiple of sampler.n_chains=16 (got 1000); try 992.",
        "error": "ConfigError: sampler.n_samples must be a multiple of sampler.n_chains=16 (got 1000); try 992.",
    }
    assert summary_of(good)["status"] == "completed"
    # the start-up header, before any heavy work
    log = next(good.glob("*.log")).read_text()
    for line in (f"run directory: {good.resolve()}", "lattice: chain(L=8", "8 sites, 8 bonds", "model: RBM(",
                 "80 parameters", "sampler: metropolis_local(", "256 samples over 16 chains",
                 "dtype: float64; backend: single, 1 process(es), 1 device(s)"):
        assert line in log, line
    assert log.index("run directory:") < log.index("lattice:") < log.index("status: completed")


def test_config_error_removes_only_the_run_directory_it_created(tmp_path):
    proc = run_cli(["sampler.n_samples=1000"], tmp_path)
    assert proc.returncode == 2
    assert not (tmp_path / "outputs").exists()  # outputs/DATE/TIME, and its new parents, are gone
    proc = run_cli(["sampler.n_samples=1000", "hydra.run.dir=new/run"], tmp_path)
    assert proc.returncode == 2 and not (tmp_path / "new").exists()

    resumed = tmp_path / "resumed"
    (resumed / ".hydra").mkdir(parents=True)
    (resumed / "metrics.jsonl").write_text('{"step": 0}\n')
    empty = tmp_path / "empty"  # a directory that existed before, even an empty one, stays
    empty.mkdir()
    for run_dir in (resumed, empty):
        assert run_cli(["sampler.n_samples=1000", f"hydra.run.dir={run_dir}"], tmp_path).returncode == 2
        assert (run_dir / ".hydra").is_dir()
    assert (resumed / "metrics.jsonl").read_text() == '{"step": 0}\n'


def test_new_dirs_are_the_missing_run_directory_and_parents(tmp_path):
    from runner.cli import new_dirs

    (tmp_path / "outputs").mkdir()
    (tmp_path / "mine").mkdir()
    got = new_dirs(["n_iter=3", "hydra.run.dir=mine/a/b"], "2026-01-01/10-00-00", cwd=tmp_path)
    assert got == {tmp_path / "outputs" / "2026-01-01" / "10-00-00", tmp_path / "outputs" / "2026-01-01",
                   tmp_path / "mine" / "a" / "b", tmp_path / "mine" / "a"}


def test_header_shortens_long_config_values():
    from runner.app import _describe

    edges = [[i, i + 1] for i in range(30)]
    assert _describe({"_target_": "runner.hilbert.graph", "n_sites": 31, "edges": edges, "positions": None}) == \
        "graph(n_sites=31, edges=[30 items])"
