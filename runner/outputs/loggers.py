"""Experiment trackers beside metrics.jsonl: TensorBoard event files and an MLflow SQLite store."""

import contextlib
import json
import logging
import math
import os
import random
import time
from pathlib import Path

from runner.config import fingerprint
from runner.errors import ConfigError
from runner.parallel import distributed

log = logging.getLogger(__name__)

LOGGERS = ("jsonl", "tensorboard", "mlflow")
LIBRARIES = {"tensorboard": "tensorboardX", "mlflow": "mlflow"}  # the module each logger imports
INSTALL = "pip install 'vmc-runner[tracking]'"
TENSORBOARD_DIR = "tensorboard"  # RUN_DIR/tensorboard/: the run's event files
MLFLOW_DB = "mlflow.db"  # SWEEP_DIR/mlflow.db in a multirun, RUN_DIR/mlflow.db for a single run
MLFLOW_ARTIFACTS = "mlartifacts"  # beside the store: copies of summary.json and the plots, per run
MLFLOW_RUN_ID = ".mlflow_run_id"  # in RUN_DIR: a resumed run goes on logging to the same MLflow run
TRACKING_DIRS = (TENSORBOARD_DIR, MLFLOW_ARTIFACTS)  # folders that hold no run of their own
MAX_PARAM_CHARS = 6000  # MLflow's limit on a parameter value (a graph's edge list can exceed it)
LOCK_RETRY_SECONDS = 300.0  # give up on a store locked this long


def selected(config: dict) -> dict[str, dict]:
    """The chosen loggers and their settings, with their libraries checked.

    Args:
        config: the resolved config; `logger` maps each chosen logger's name to its settings
            (the `logger` group takes a list: `logger=[jsonl,tensorboard,mlflow]`).

    Returns:
        {name: settings} for the trackers other than jsonl (whose files are always written).

    Raises:
        ConfigError: an unknown logger, or one whose library is not installed.
    """
    chosen = config.get("logger") or {}
    if not isinstance(chosen, dict):
        raise ConfigError("logger", f"must be a list of loggers among {', '.join(LOGGERS)} (got {chosen!r})")
    for name in chosen:
        if name not in LOGGERS:
            raise ConfigError("logger", f"has no logger {name!r}; choose among {', '.join(LOGGERS)}")
    trackers = {name: dict(settings or {}) for name, settings in chosen.items() if name != "jsonl"}
    for name in trackers:
        module = LIBRARIES[name]
        try:
            __import__(module)
        except ImportError:
            raise ConfigError(f"logger={name}", f"needs the {module} package, which is not installed; "
                              f"run {INSTALL}") from None
    return trackers


def params_of(config: dict) -> dict[str, str]:
    """The resolved config flattened to {"group.key": text}: what every tracker records as params."""
    flat = fingerprint.of(config, exclude=("hydra",))
    text = {k: v if isinstance(v, str) else json.dumps(v, default=str) for k, v in flat.items()}
    return {k: v if len(v) <= MAX_PARAM_CHARS else v[:MAX_PARAM_CHARS - 3] + "..." for k, v in text.items()}


def numbers(record: dict) -> dict[str, float]:
    """The finite numeric fields of a metrics record or a summary (no step, bools or strings)."""
    return {k: float(v) for k, v in record.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


class TensorBoardLogger:
    """Event files under RUN_DIR/tensorboard: one scalar series per metrics field, the config as text."""

    def __init__(self, run_dir: Path, settings: dict, start_step: int):
        from tensorboardX import SummaryWriter

        events_dir = run_dir / TENSORBOARD_DIR
        if not start_step and events_dir.is_dir():
            # A run started over in a used directory (resume=false): the old run's series would
            # be read together with this one's.
            for old in events_dir.glob("events.out.tfevents.*"):
                old.unlink()
        # purge_step: a resumed run hides the events it had written past its checkpoint
        self.writer = SummaryWriter(str(run_dir / TENSORBOARD_DIR), flush_secs=int(settings.get("flush_secs", 30)),
                                    purge_step=start_step or None)

    def log_params(self, params: dict):
        table = "\n".join(f"| {k} | {v} |" for k, v in params.items())
        self.writer.add_text("config", "| key | value |\n|---|---|\n" + table, 0)

    def log_metrics(self, record: dict):
        for key, value in numbers(record).items():
            self.writer.add_scalar(key, value, record["step"])

    def close(self, summary: dict, artifacts: list[Path]):
        step = summary.get("n_iter") or 0
        for key, value in numbers(summary).items():
            self.writer.add_scalar(f"final/{key}", value, step)
        self.writer.add_text("summary", "```\n" + json.dumps(summary, indent=2, default=str) + "\n```", step)
        self.writer.close()


def _locked(error: Exception) -> bool:
    return "database is locked" in str(error) or "database table is locked" in str(error)


class MLflowLogger:
    """One MLflow run in a SQLite store shared by a sweep's jobs.

    Concurrent jobs take turns: every write holds an exclusive lock on `mlflow.db.lock` beside the
    store (so the first job creates the tables alone), and a write that still finds the database
    locked (a file system without working locks) is retried with growing, jittered waits.
    """

    def __init__(self, run_dir: Path, settings: dict, store_dir: Path, experiment: str, run_name: str,
                 resumed: bool = False):
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # compute nodes rarely reach the internet
        from mlflow.tracking import MlflowClient

        uri = settings.get("tracking_uri")
        store_dir.mkdir(parents=True, exist_ok=True)
        self.lock_path = store_dir / (MLFLOW_DB + ".lock")
        self.uri = uri or f"sqlite:///{(store_dir / MLFLOW_DB).resolve()}"
        self.flush_secs = float(settings.get("flush_secs", 10.0))
        self.client = self._write(MlflowClient, tracking_uri=self.uri)  # creates the tables: one process at a time
        self.pending, self.flushed_at = [], time.monotonic()
        id_file = run_dir / MLFLOW_RUN_ID
        experiment = settings.get("experiment_name") or experiment
        # Only a resumed run (its checkpoint proved to be this config's) continues the MLflow run
        # recorded in its directory; a run started over there gets a new one.
        self.run_id = id_file.read_text().strip() if resumed and id_file.exists() else None
        if self.run_id is None:
            experiment_id = self._write(self._experiment_id, experiment, (store_dir / MLFLOW_ARTIFACTS).resolve())
            run = self._write(self.client.create_run, experiment_id, run_name=run_name,
                              tags={"run_dir": str(run_dir.resolve())})
            self.run_id = run.info.run_id
            id_file.write_text(self.run_id + "\n")
        else:
            self._write(self.client.update_run, self.run_id, status="RUNNING")

    def _experiment_id(self, name: str, artifacts: Path) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        return self.client.create_experiment(name, artifact_location=artifacts.as_uri())

    def _write(self, fn, *args, **kwargs):
        """`fn(*args, **kwargs)` holding the store's lock, retried while the database is locked."""
        import fcntl

        wait, deadline = 0.05, time.monotonic() + LOCK_RETRY_SECONDS
        while True:
            with open(self.lock_path, "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                try:
                    return fn(*args, **kwargs)
                except Exception as err:
                    if not _locked(err) or time.monotonic() > deadline:
                        raise
                finally:
                    fcntl.flock(lock, fcntl.LOCK_UN)
            log.info("mlflow store locked; retrying in %.2f s", wait)
            time.sleep(wait * (1 + random.random()))
            wait = min(2 * wait, 5.0)

    def log_params(self, params: dict):
        from mlflow.entities import Param

        existing = self._write(self.client.get_run, self.run_id).data.params
        items = [Param(k, v) for k, v in params.items() if k not in existing]  # a param is written once
        for i in range(0, len(items), 100):  # MLflow's limit per batch
            self._write(self.client.log_batch, self.run_id, params=items[i:i + 100])

    def log_metrics(self, record: dict):
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.pending += [Metric(k, v, now, record["step"]) for k, v in numbers(record).items()]
        if time.monotonic() - self.flushed_at >= self.flush_secs:
            self.flush()

    def flush(self):
        """Sends the buffered metrics (steps are written in batches, not one transaction each)."""
        for i in range(0, len(self.pending), 1000):  # MLflow's limit per batch
            self._write(self.client.log_batch, self.run_id, metrics=self.pending[i:i + 1000])
        self.pending, self.flushed_at = [], time.monotonic()

    def close(self, summary: dict, artifacts: list[Path]):
        """Logs the summary's numbers, copies of the `artifacts` that exist, and the run's end."""
        from mlflow.entities import Metric

        self.flush()
        step, now = summary.get("n_iter") or 0, int(time.time() * 1000)
        final = [Metric(f"final/{k}", v, now, step) for k, v in numbers(summary).items()]
        self._write(self.client.log_batch, self.run_id, metrics=final,
                    tags=[_tag("status", summary.get("status")), _tag("reason", summary.get("reason"))])
        for path in artifacts:
            if path.is_file():
                self._write(self.client.log_artifact, self.run_id, str(path))
        status = {"completed": "FINISHED", "failed": "FAILED"}.get(summary.get("status"), "KILLED")
        self._write(self.client.set_terminated, self.run_id, status)


def _tag(key, value):
    from mlflow.entities import RunTag

    return RunTag(key, str(value)[:5000] if value is not None else "")


class Tracking:
    """The trackers of one run: opened when the run starts (after the header), fed every step's
    metrics, closed with the summary and plots. Only process 0 tracks; a tracker that fails
    while logging is reported once and dropped, never stopping the run."""

    def __init__(self, chosen: dict[str, dict], params: dict, run_dir: Path, store_dir: Path,
                 experiment: str, run_name: str, *, artifacts=()):
        self.chosen, self.params, self.run_dir = chosen, params, run_dir
        self.artifacts = [run_dir / name for name in artifacts]  # copied to MLflow when the run closes
        self.store_dir, self.experiment, self.run_name = store_dir, experiment, run_name
        self.active = {}

    def open(self, start_step: int = 0) -> "Tracking":

        if not distributed.is_main():
            return self
        for name, settings in self.chosen.items():
            if name == "tensorboard":
                tracker = TensorBoardLogger(self.run_dir, settings, start_step)
            else:
                tracker = MLflowLogger(self.run_dir, settings, self.store_dir, self.experiment, self.run_name,
                                       resumed=start_step > 0)
            self.active[name] = tracker
            self._call(name, "log_params", self.params)
        return self

    def _call(self, name, method, *args):
        tracker = self.active.get(name)
        if tracker is None:
            return
        try:
            getattr(tracker, method)(*args)
        except Exception:  # tracking is a record of the run, not part of it
            log.exception("logger %s failed in %s; it stops logging this run", name, method)
            self.active.pop(name, None)

    def log_metrics(self, record: dict):
        for name in list(self.active):
            self._call(name, "log_metrics", record)

    def close(self, summary: dict):
        for name in list(self.active):
            self._call(name, "close", summary, self.artifacts)
        self.active = {}


def setup(config: dict, run_dir: Path, sweep_dir: Path | None, *, artifacts=()) -> Tracking:
    """The run's trackers, checked (a missing library is a config error) but not yet opened.
    `artifacts`: the names of RUN_DIR's files MLflow keeps a copy of.

    The MLflow store is SWEEP_DIR/mlflow.db in a multirun (experiment: the sweep directory, one
    MLflow run per job) and RUN_DIR/mlflow.db for a single run (experiment: the run directory);
    `logger.mlflow.tracking_uri` and `experiment_name` override both.
    """
    chosen = selected(config)
    store_dir = sweep_dir if sweep_dir is not None else run_dir
    with contextlib.suppress(ValueError):
        store_dir = store_dir.resolve().relative_to(Path.cwd())
    run_name = run_dir.name if sweep_dir is not None else str(store_dir)
    return Tracking(chosen, params_of(config) if chosen else {}, run_dir, store_dir, str(store_dir), run_name,
                    artifacts=artifacts)
