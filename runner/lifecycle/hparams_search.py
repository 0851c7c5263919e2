"""Hyperparameter search with Hydra's Optuna sweeper: a run's objective value and the study's store."""

import json
import logging
import math
from pathlib import Path

from runner.errors import ConfigError, RunStopped
from runner.lifecycle.rundir import SUMMARY

log = logging.getLogger(__name__)

METRICS = ("energy", "v_score", "variance", "relative_error")  # summary.json fields a search may minimise
# A failed, diverged or preempted trial's value: finite (Optuna's samplers rank trials by value)
# and worse than any real one, so the search learns to avoid its region instead of stopping.
PENALTY = 1e10
# Loggers whose INFO lines are set-up noise of the study's store: alembic's plugin set-up (on
# importing optuna) and migrations, optuna's "A new study created in RDB". Their warnings stay.
STORAGE_LOGGERS = ("alembic", "optuna.storages._rdb.storage")


def check(config: dict) -> str:
    """The `optimized_metric` of a resolved config, checked before anything runs.

    Raises:
        ConfigError: not one of METRICS.
    """
    metric = config.get("optimized_metric")
    if metric not in METRICS:
        raise ConfigError("optimized_metric", f"must be one of {', '.join(METRICS)} (got {metric!r})")
    return metric


def objective(summary: dict | None, metric: str, direction: str = "minimize") -> float:
    """What a trial returns to the sweeper: the summary's `metric`, or PENALTY (-PENALTY when
    maximising) for a run that did not complete or has no finite value of it."""
    value = (summary or {}).get(metric) if (summary or {}).get("status") == "completed" else None
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    status = (summary or {}).get("status", "no summary")
    log.warning("trial counted as bad (%s = %g): status %s, %s = %s", metric, PENALTY, status, metric, value)
    return -PENALTY if direction == "maximize" else PENALTY


def run_trial(fn, run_dir: Path, metric: str, direction: str = "minimize") -> float:
    """Runs one trial (`fn()`, returning its summary) and returns its objective; a failure of any
    kind (a config error, a failed run, an exception) is a bad value, never the end of the study.
    A stopped run (RunStopped) still stops the study: a re-run resumes it from its store."""
    try:
        summary = fn()
    except RunStopped:
        raise
    except Exception:  # a failed run's summary.json holds its reason (written by app.run)
        summary = None
    if not isinstance(summary, dict):
        path = Path(run_dir) / SUMMARY
        try:
            summary = json.loads(path.read_text())
        except (OSError, ValueError):
            summary = {"status": "failed"}
    return objective(summary, metric, direction)


def quiet_storage_logs():
    """Sets the store's set-up loggers (`STORAGE_LOGGERS`) to WARNING: called before Hydra loads
    the Optuna sweeper (whose import of optuna already logs alembic's set-up) and with the store."""
    for name in STORAGE_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def sqlite_storage(path: str) -> str:
    """The Optuna storage URL of a SQLite file, its folder created (the sweeper opens the study
    before the launcher creates the sweep directory), its set-up noise silenced."""
    quiet_storage_logs()
    path = Path(path).absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"
