"""The command line: smoke run, sweeps, bad input, kill-and-resume, NaN handling."""

import dataclasses
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from runner.errors import RunFailed
from tests.helpers.cli import REPO, run_cli

SMALL = ["hilbert.L=8", "sampler.n_samples=256", "sampler.n_chains=8", "final_rounds=2"]
METRIC_KEYS = {"step", "energy", "energy_error", "variance", "r_hat", "tau_corr", "acceptance", "wall_time"}
SUMMARY_KEYS = {
    "status", "energy", "energy_error", "variance", "v_score", "exact_energy", "relative_error",
    "n_iter", "n_params", "n_samples", "n_chains", "backend", "processes", "devices",
    "seconds_per_iter", "compile_seconds", "wall_seconds",
}


def read_metrics(run_dir):
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def read_summary(run_dir):
    return json.loads((Path(run_dir) / "summary.json").read_text())


def test_small_run_writes_every_output(tmp_path):
    run_cli([*SMALL, "n_iter=12", "checkpoint_every=5", f"hydra.run.dir={tmp_path}"], REPO, check=True)
    metrics = read_metrics(tmp_path)
    assert [m["step"] for m in metrics] == list(range(12))
    assert all(METRIC_KEYS <= set(m) for m in metrics)
    summary = read_summary(tmp_path)
    assert SUMMARY_KEYS <= set(summary)
    assert summary["status"] == "completed" and summary["backend"] == "single" and summary["devices"] == 1
    assert summary["exact_energy"] < 0 and summary["relative_error"] is not None
    assert (tmp_path / "energy.png").stat().st_size > 1000
    assert (tmp_path / "checkpoint" / "state.npz").is_file()
    assert (tmp_path / ".hydra" / "config.yaml").is_file()
    assert not list((tmp_path / "checkpoint").glob(".state-*"))  # no half-written leftovers


@pytest.mark.slow
def test_default_run_is_accurate(tmp_path):
    """`make run` with no overrides: small TFIM chain, relative error below 1e-3."""
    proc = run_cli([f"hydra.run.dir={tmp_path}"], REPO, check=True)
    summary = read_summary(tmp_path)
    assert summary["relative_error"] < 1e-3, summary
    assert "relative error" in proc.stderr + proc.stdout


def test_run_directory_is_shared_by_the_ranks_of_a_slurm_job(tmp_path):
    from runner.cli import run_id

    assert run_id({"SLURM_JOB_ID": "4242"}) == "slurm-4242"
    assert run_id({"SLURM_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "3"}) == "slurm-7_3"
    assert run_id({}).count("/") == 1  # DATE/TIME
    env = {"SLURM_JOB_ID": "4242"}
    run_cli([*SMALL, "n_iter=2", "exact=false"], tmp_path, env=env, check=True)
    assert (tmp_path / "outputs" / "slurm-4242" / "summary.json").is_file()


def test_multirun_sweep(tmp_path):
    run_cli(["-m", *SMALL, "model.alpha=1,2", "n_iter=4", f"hydra.sweep.dir={tmp_path}"], REPO, check=True)
    summaries = sorted(tmp_path.glob("*/summary.json"))
    assert len(summaries) == 2
    n_params = sorted(json.loads(p.read_text())["n_params"] for p in summaries)
    assert n_params[0] < n_params[1]


@pytest.mark.parametrize(
    "args,key",
    [
        (["sampler.n_samples=1000"], "sampler.n_samples"),
        (["model.alpha=-1"], "model.alpha"),
        (["hilbert.L=-4"], "hilbert.L"),
        (["n_iter=-5"], "n_iter"),
        (["preconditioner.diag_shift=-1"], "preconditioner.diag_shift"),
        (["model=transformer"], "model=transformer"),
        (["hilbert=chain", "hilbert.total_sz=0.5", "hamiltonian=heisenberg", "sampler=metropolis_exchange"], "hilbert.total_sz"),
        (["model.nonexistent=3"], ""),
    ],
)
def test_bad_input_is_one_sentence_and_exit_2(tmp_path, args, key):
    proc = run_cli([*args, f"hydra.run.dir={tmp_path}"], REPO)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert key in proc.stderr
    assert not (tmp_path / "metrics.jsonl").exists()
    if key:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("Config error:"), proc.stderr


RESUME = ["hilbert.L=12", "sampler.n_samples=512", "sampler.n_chains=8", "final_rounds=1",
          "n_iter=60", "checkpoint_every=10", "exact=false"]


def signal_after_steps(args, run_dir, n_steps, signum):
    """Starts a run and sends it `signum` as soon as `n_steps` metrics lines exist."""
    proc = subprocess.Popen([sys.executable, "-m", "runner", *args, f"hydra.run.dir={run_dir}"],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    metrics, deadline = run_dir / "metrics.jsonl", time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= n_steps:
            proc.send_signal(signum)
            break
        time.sleep(0.005)
    return proc


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted RESUME run that the killed and the stopped runs resume into."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    run_cli([*RESUME, f"hydra.run.dir={run_dir}"], REPO, check=True)
    return run_dir


def test_kill_and_resume_continues_exactly(reference, tmp_path):
    killed = tmp_path / "killed"

    proc = signal_after_steps(RESUME, killed, 25, signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    assert not (killed / "summary.json").exists()
    n_before = len(read_metrics(killed))

    run_cli([*RESUME, f"hydra.run.dir={killed}"], REPO, check=True)
    ref, got = read_metrics(reference), read_metrics(killed)
    assert [m["step"] for m in got] == list(range(60)), n_before
    for a, b in zip(ref, got):
        assert a["energy"] == b["energy"] and a["energy_error"] == b["energy_error"], (a, b)
    assert read_summary(reference)["energy"] == read_summary(killed)["energy"]


def test_stop_signal_checkpoints_and_resume_is_exact(reference, tmp_path):
    """SIGTERM (SLURM preemption, scontrol requeue) stops at a step boundary after a checkpoint."""
    stopped = tmp_path / "stopped"
    proc = signal_after_steps(RESUME, stopped, 15, signal.SIGTERM)
    stderr = proc.communicate(timeout=60)[1]
    assert proc.returncode == 3, stderr
    summary = read_summary(stopped)
    assert summary["status"] == "preempted"
    n_done = len(read_metrics(stopped))
    assert 15 <= n_done < 60
    with np.load(stopped / "checkpoint" / "state.npz") as data:  # saved at the stopping step
        assert json.loads(bytes(data["meta"]).decode())["step"] == n_done

    run_cli([*RESUME, f"hydra.run.dir={stopped}"], REPO, check=True)
    assert [m["energy"] for m in read_metrics(stopped)] == [m["energy"] for m in read_metrics(reference)]
    assert read_summary(stopped)["energy"] == read_summary(reference)["energy"]
    assert read_summary(stopped)["status"] == "completed"
    # A second re-run finds the run completed and skips it without compiling.
    again = run_cli([*RESUME, f"hydra.run.dir={stopped}"], REPO, check=True)
    assert "already completed" in again.stderr + again.stdout


def test_nan_energy_fails_and_keeps_last_good_checkpoint(tmp_path):
    from runner import app
    from runner.config.build import build
    from runner.parallel import mesh
    from tests.helpers.config import compose_config

    config = compose_config([*SMALL, "n_iter=4", "checkpoint_every=2", "exact=false"])
    experiment = build(config)
    layout = mesh.make_mesh("single")
    app.execute(experiment, layout, tmp_path)
    saved = (tmp_path / "checkpoint" / "state.npz").read_bytes()

    ham = experiment.hamiltonian._replace(diag_coef=np.full_like(experiment.hamiltonian.diag_coef, np.nan))
    broken = dataclasses.replace(
        experiment,
        hamiltonian=ham,
        problem=dataclasses.replace(experiment.problem, hamiltonian=ham),
        settings=dataclasses.replace(experiment.settings, n_iter=8),
    )
    with pytest.raises(RunFailed) as failed:
        app.execute(broken, layout, tmp_path)
    assert failed.value.status == "failed"
    summary = read_summary(tmp_path)
    assert summary["status"] == "failed"
    assert (tmp_path / "checkpoint" / "state.npz").read_bytes() == saved
    metrics = read_metrics(tmp_path)
    assert [m["step"] for m in metrics] == [0, 1, 2, 3, 4] and metrics[-1]["energy"] is None


def test_an_old_projection_key_on_the_command_line_names_its_replacement():
    from runner.cli import check_overrides
    from runner.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        check_overrides(["model=cnn", "model.symmetries=lattice"])
    assert info.value.sentence() == ("model.symmetries is not a key of model=cnn; model.sector replaces "
                                     "model.symmetries, parity and momentum.")


def test_keys_are_checked_against_the_experiments_groups():
    """After experiment=j1j2_square (hilbert: square) hilbert.Lx is a key; a group chosen on the
    command line still wins over the experiment's."""
    from runner.cli import check_overrides
    from runner.errors import ConfigError

    check_overrides(["experiment=j1j2_square", "hilbert.Lx=4"])
    with pytest.raises(ConfigError, match="hilbert.Lx is not a key of hilbert=chain"):
        check_overrides(["experiment=j1j2_square", "hilbert=chain", "hilbert.Lx=4"])
