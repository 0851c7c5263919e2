"""runner.outputs.loggers: TensorBoard event files and the MLflow store read back with their own readers,
one shared SQLite store written by concurrent processes, a missing library as one sentence."""

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from runner import report
from runner.errors import ConfigError
from runner.outputs import loggers
from tests.helpers.cli import REPO, run_cli

TINY = ["hilbert.L=6", "sampler.n_samples=128", "n_iter=10", "final_rounds=1"]


def metrics_of(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def mlflow_client(store):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{Path(store).resolve()}")


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory):
    """One CLI run with all three loggers and the spin observables every 2 steps."""
    cwd = tmp_path_factory.mktemp("tracked")
    run_cli([*TINY, "logger=[jsonl,tensorboard,mlflow]", "observables=spin", "observables.every=2",
             "hydra.run.dir=run"], cwd, check=True)
    return cwd / "run"


@pytest.mark.slow
def test_tensorboard_events_hold_the_metrics_jsonl_series(tracked_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    records = metrics_of(tracked_run)
    events = EventAccumulator(str(tracked_run / "tensorboard"))
    events.Reload()
    energy = [(e.step, e.value) for e in events.Scalars("energy")]
    assert energy == [(r["step"], pytest.approx(r["energy"], rel=1e-6)) for r in records]
    measured = [r for r in records if "obs/mz2" in r]
    assert measured and [(e.step, e.value) for e in events.Scalars("obs/mz2")] == [
        (r["step"], pytest.approx(r["obs/mz2"], rel=1e-6)) for r in measured]
    summary = json.loads((tracked_run / "summary.json").read_text())
    (final,) = events.Scalars("final/energy")
    assert final.value == pytest.approx(summary["energy"], rel=1e-6)
    assert "config/text_summary" in events.Tags()["tensors"]


@pytest.mark.slow
def test_mlflow_store_holds_params_metrics_and_artifacts(tracked_run):
    client = mlflow_client(tracked_run / "mlflow.db")
    (experiment,) = [e for e in client.search_experiments() if e.name != "Default"]
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.tags["run_dir"] == str(tracked_run.resolve())
    params = run.data.params
    assert (params["hilbert.L"], params["sampler.n_samples"], params["n_iter"]) == ("6", "128", "10")
    assert params["logger.mlflow.flush_secs"] == "10" and "hydra.run.dir" not in params
    records = metrics_of(tracked_run)
    history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "energy"))
    assert history == [(r["step"], r["energy"]) for r in records]
    assert len(client.get_metric_history(run.info.run_id, "obs/zz_nn")) == sum("obs/zz_nn" in r for r in records)
    summary = json.loads((tracked_run / "summary.json").read_text())
    assert run.data.metrics["final/energy"] == summary["energy"]
    assert run.data.tags["status"] == "completed"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"summary.json", "energy.png", "correlations.json"} <= artifacts
    copied = Path(client.download_artifacts(run.info.run_id, "summary.json", str(tracked_run.parent)))
    assert json.loads(copied.read_text()) == summary


@pytest.mark.slow
def test_report_reads_the_store_and_skips_the_trackers_folders(tracked_run, capsys):
    rows = report.report(tracked_run, plots=False)
    assert len(rows) == 1  # mlartifacts/ holds a copy of summary.json: not a second run
    out = capsys.readouterr().out
    assert "mlflow: 1 of 1 run(s)" in out and "tensorboard: 1 of 1 run(s)" in out
    run_id = (tracked_run / loggers.MLFLOW_RUN_ID).read_text().strip()
    assert rows[0]["mlflow_run_id"] == run_id
    assert run_id in (tracked_run / "report.csv").read_text()


@pytest.mark.slow
def test_a_resumed_run_goes_on_in_the_same_mlflow_run_and_tensorboard_series(tmp_path):
    args = ["hilbert.L=6", "sampler.n_samples=128", "final_rounds=1", "exact=false", "checkpoint_every=4",
            "logger=[tensorboard,mlflow]", "logger.mlflow.flush_secs=0", "hydra.run.dir=run"]
    run_cli([*args, "n_iter=6"], tmp_path, check=True)
    run_cli([*args, "n_iter=10"], tmp_path, check=True)  # resumes from the checkpoint at step 6
    run_dir = tmp_path / "run"
    records = metrics_of(run_dir)
    assert [r["step"] for r in records] == list(range(10))
    client = mlflow_client(run_dir / "mlflow.db")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "energy"))
    assert [s for s, _ in history] == list(range(10)) and run.info.status == "FINISHED"
    assert history == [(r["step"], r["energy"]) for r in records]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("energy")] == [
        (r["step"], pytest.approx(r["energy"], rel=1e-6)) for r in records]


@pytest.mark.slow
def test_a_run_started_over_gets_a_new_mlflow_run_and_tensorboard_series(tmp_path):
    args = ["hilbert.L=6", "sampler.n_samples=128", "final_rounds=1", "exact=false", "n_iter=3",
            "logger=[mlflow,tensorboard]", "logger.mlflow.flush_secs=0", "hydra.run.dir=run"]
    run_cli(args, tmp_path, check=True)
    run_cli([*args, "seed=1", "resume=false"], tmp_path, check=True)  # another config, started over
    run_dir = tmp_path / "run"
    client = mlflow_client(run_dir / "mlflow.db")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 2
    latest = (run_dir / ".mlflow_run_id").read_text().strip()
    history = sorted((m.step, m.value) for m in client.get_metric_history(latest, "energy"))
    assert history == [(r["step"], r["energy"]) for r in metrics_of(run_dir)]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()  # only the second run's series: the first run's event file was removed
    assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 1
    assert [(e.step, e.value) for e in events.Scalars("energy")] == [
        (r["step"], pytest.approx(r["energy"], rel=1e-6)) for r in metrics_of(run_dir)]


WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from runner.outputs.loggers import MLflowLogger
    store, run_dir, start_at = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
    run_dir.mkdir(parents=True)
    time.sleep(max(0.0, start_at - time.time()))  # all writers start together: tables created once
    logger = MLflowLogger(run_dir, {"flush_secs": 0}, store, "concurrent", run_dir.name)
    logger.log_params({"job": run_dir.name, "seed": "0"})
    for step in range(40):
        logger.log_metrics({"step": step, "energy": -float(step), "variance": 1.0 / (1 + step)})
    (run_dir / "summary.json").write_text('{"status": "completed", "energy": -39.0}')
    logger.close({"status": "completed", "energy": -39.0, "n_iter": 40}, [run_dir / "summary.json"])
""")


@pytest.mark.slow
def test_concurrent_processes_write_one_store(tmp_path):
    """Four processes create and write the same SQLite store at once: none fails, nothing is lost."""
    start_at = time.time() + 8.0  # after every interpreter has imported mlflow
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(tmp_path / f"job{i}"),
                               str(start_at)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
             for i in range(4)]
    for proc in procs:
        out, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, out[-3000:]
    client = mlflow_client(tmp_path / "mlflow.db")
    (experiment,) = [e for e in client.search_experiments() if e.name == "concurrent"]
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(r.data.params["job"] for r in runs) == [f"job{i}" for i in range(4)]
    for run in runs:
        assert run.info.status == "FINISHED"
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "energy"))
        assert history == [(s, -float(s)) for s in range(40)]
        assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["summary.json"]


def test_selected_checks_names_and_libraries(monkeypatch):
    chosen = loggers.selected({"logger": {"jsonl": {}, "tensorboard": {"flush_secs": 5}}})
    assert chosen == {"tensorboard": {"flush_secs": 5}}
    assert loggers.selected({"logger": {"jsonl": {}}}) == {}
    with pytest.raises(ConfigError, match="no logger 'wandb'"):
        loggers.selected({"logger": {"wandb": {}}})
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"needs the mlflow package.*pip install 'vmc-runner\[tracking\]'"):
        loggers.selected({"logger": {"jsonl": {}, "mlflow": {}}})


def test_params_are_the_whole_flattened_config():
    config = {"seed": 1, "n_iter": 5, "hilbert": {"L": 6, "pbc": True}, "logger": {"jsonl": {}},
              "hamiltonian": {"terms": [{"ops": "X"}]}, "hydra": {"run": {"dir": "x"}}}
    assert loggers.params_of(config) == {"seed": "1", "n_iter": "5", "hilbert.L": "6", "hilbert.pbc": "true",
                                         "logger.jsonl": "{}", "hamiltonian.terms": '[{"ops": "X"}]'}


def test_a_missing_library_is_one_sentence_and_exit_2(tmp_path):
    code = ("import sys; sys.modules['tensorboardX'] = None; sys.argv[0] = 'runner'; "
            "from runner import cli; cli.main()")
    proc = subprocess.run([sys.executable, "-c", code, *TINY, "logger=[jsonl,tensorboard]", "hydra.run.dir=run"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == ["Config error: logger=tensorboard needs the tensorboardX package, which is not installed; "
                     "run pip install 'vmc-runner[tracking]'."]
    assert not (tmp_path / "run").exists()


def test_an_unknown_logger_on_the_command_line_is_refused(tmp_path):
    proc = run_cli(["logger=[jsonl,wandb]"], tmp_path, timeout=60)
    assert proc.returncode == 2
    assert "logger=wandb is not an option; choose one of: jsonl, mlflow, tensorboard." in proc.stderr


def _slurm_reason():
    from tests.helpers.slurm import slurm_unavailable

    return slurm_unavailable()


@pytest.mark.slow
@pytest.mark.slurm
def test_two_concurrent_slurm_jobs_log_to_one_mlflow_store(tmp_path):
    """A 2-job sweep on the local SLURM (`make slurm-up`), both jobs running at once, each an MLflow
    run in SWEEP_DIR/mlflow.db; skipped without SLURM like tests/integration/test_slurm.py."""
    reason = _slurm_reason()
    if reason is not None:
        pytest.skip(reason)
    import uuid

    sweep_dir = tmp_path / "sweep"
    name = f"vmc-test-{uuid.uuid4().hex[:8]}"
    args = [sys.executable, "-m", "runner", "-m", "hydra/launcher=slurm", f"hydra.sweep.dir={sweep_dir}",
            f"hydra.launcher.name={name}", "hydra.launcher.array_parallelism=2", *TINY, "exact=false",
            "logger=[jsonl,mlflow]", "logger.mlflow.flush_secs=0", "model.alpha=1,2"]
    try:
        proc = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    finally:
        subprocess.run(["scancel", "-n", name], capture_output=True, timeout=20)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    run_dirs = sorted(p.parent for p in sweep_dir.glob("*/summary.json"))
    assert len(run_dirs) == 2
    client = mlflow_client(sweep_dir / "mlflow.db")
    (experiment,) = [e for e in client.search_experiments() if e.name != "Default"]
    runs = {Path(r.data.tags["run_dir"]): r for r in client.search_runs([experiment.experiment_id])}
    assert sorted(runs) == [d.resolve() for d in run_dirs]
    for run_dir, run in runs.items():
        assert run.info.status == "FINISHED" and run.data.params["model.alpha"] == run_dir.name.split("alpha=")[1][0]
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "energy"))
        assert history == [(r["step"], r["energy"]) for r in metrics_of(run_dir)]
    # both jobs were running at the same time (their step intervals overlap)
    spans = [(run.info.start_time, run.info.end_time) for run in runs.values()]
    assert max(s for s, _ in spans) < min(e for _, e in spans)
