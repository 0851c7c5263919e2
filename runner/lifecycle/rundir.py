"""A run directory: the name of everything a run keeps there, and whether a run skips, resumes or
is refused there.

    RUN_DIR/.hydra/            Hydra's record of the composition (`CONFIG`, `OVERRIDES`, `HYDRA_CONFIG`)
    RUN_DIR/<job name>.log     Hydra's job log, shared by every rank
    RUN_DIR/metrics.jsonl      one JSON object per step
    RUN_DIR/trajectory.jsonl   task=dynamics: one JSON object per saved time
    RUN_DIR/exact_trajectory.json  task=dynamics: the exact dynamics on the same times, when computed
    RUN_DIR/dynamics.png       task=dynamics: every observable against t, with the exact curve
    RUN_DIR/summary.json       the result, or why there is none (a failed or stopped run's reason)
    RUN_DIR/correlations.json  with observables
    RUN_DIR/energy.png
    RUN_DIR/checkpoint/        `runner.lifecycle.checkpoint.FILENAME`
    RUN_DIR/evaluation.json    `runner.evaluate`'s result
    SWEEP_DIR/.exact_cache/    exact energies shared by a sweep's points (`runner.lifecycle.sweep_cache`)

The trackers' files (tensorboard/, mlflow.db, .mlflow_run_id) are named by `runner.outputs.loggers`.
"""

import json
import shutil
import time
from pathlib import Path

from runner.config import fingerprint
from runner.config.task import Dynamics
from runner.errors import ConfigError
from runner.lifecycle import checkpoint

HYDRA = ".hydra"
CONFIG = f"{HYDRA}/config.yaml"  # the resolved config the run was composed with
OVERRIDES = f"{HYDRA}/overrides.yaml"  # the command line's overrides
HYDRA_CONFIG = f"{HYDRA}/hydra.yaml"  # Hydra's own settings (a sweep job's number)
JOB_LOG_SUFFIX = ".log"
METRICS = "metrics.jsonl"
TRAJECTORY = "trajectory.jsonl"  # task=dynamics: t, energy, obs/<name>, dt and the TDVP residual per saved time
EXACT_TRAJECTORY = "exact_trajectory.json"  # task=dynamics: exact energy and observables on the saved times
DYNAMICS_PLOT = "dynamics.png"
SUMMARY = "summary.json"
CORRELATIONS = "correlations.json"  # with observables: the <Z_i Z_j> matrix and S(q) on every momentum
SPECTRUM = "spectrum.json"  # the exact levels by symmetry sector (runner.lifecycle.sector_check)
ENERGY_PLOT = "energy.png"
OBSERVABLES_PLOT = "observables.png"  # runner.report's, in the directory it reports on
CHECKPOINT = "checkpoint"
EVALUATION = "evaluation.json"
EXACT_CACHE = ".exact_cache"  # under a sweep's directory
REPLACED_PREFIX = "replaced-"  # resume=false moves an earlier run's records into RUN_DIR/replaced-<UTC time>/
ARTIFACTS = (SUMMARY, ENERGY_PLOT, OBSERVABLES_PLOT, CORRELATIONS, DYNAMICS_PLOT)  # what the trackers keep a copy of


def completed_summary(run_dir: Path, settings) -> dict | None:
    """The summary of a finished run of the same length and config (final_rounds included).

    Anything else is None: the checkpoint then decides (`resumable`), so a finished run with
    another config is refused there, and one with another n_iter or final_rounds continues.
    """
    path = run_dir / SUMMARY
    if not (settings.resume and path.exists() and checkpoint.exists(run_dir / CHECKPOINT)):
        return None
    try:
        summary = json.loads(path.read_text())
    except ValueError:  # cut short: not a finished run's
        return None
    stored = summary.get("config_fingerprint")
    if (summary.get("status") == "completed" and _same_length(summary, settings)
            and fingerprint.same(stored, settings.fingerprint)):
        return summary
    return None


def _same_length(summary: dict, settings) -> bool:
    """Whether a summary's run went as far as this config asks: n_iter steps, or a time evolution to t_end."""
    if isinstance(settings.task, Dynamics):
        return summary.get("t_reached") == settings.task.t_end
    return summary.get("n_iter") == settings.n_iter


def resumable(run_dir: Path, settings) -> bool:
    """Whether to resume from run_dir/checkpoint: resume is on and a checkpoint exists.

    Raises:
        ConfigError: the checkpoint belongs to a config that differs in a key that changes the
            numbers (final_rounds may differ), or predates config fingerprints; the directory
            holds a run's records (`run_records`) but no checkpoint.
        CorruptCheckpoint: the checkpoint is unreadable.
    """
    if not settings.resume:
        return False
    if not checkpoint.exists(run_dir / CHECKPOINT):
        records = run_records(run_dir)
        if records:
            raise ConfigError("resume", f"is true and {run_dir} holds a run's records ({', '.join(records)}) but no "
                              f"checkpoint ({CHECKPOINT}/{checkpoint.FILENAME} is missing); use resume=false to "
                              "start over (the old records are moved aside) or a new run directory")
        return False
    meta = checkpoint.read_meta(run_dir / CHECKPOINT)
    fingerprint.check(meta.get("config_fingerprint"), settings.fingerprint, run_dir,
                      ignore=fingerprint.RESUME_IGNORES)
    return True


def run_records(run_dir: Path) -> list[str]:
    """The names of a run's records in run_dir: metrics.jsonl with a line, summary.json (but a
    failed summary of no steps, a config error's), trajectory.jsonl; [] when none."""
    found = []
    metrics = run_dir / METRICS
    if metrics.is_file() and metrics.stat().st_size > 0:
        found.append(METRICS)
    if (run_dir / SUMMARY).is_file() and not _config_error_summary(run_dir / SUMMARY):
        found.append(SUMMARY)
    if (run_dir / TRAJECTORY).is_file():
        found.append(TRAJECTORY)
    return found


def _config_error_summary(path: Path) -> bool:
    """Whether a summary.json is a failed run's that took no step (a sweep point's config error)."""
    try:
        summary = json.loads(path.read_text())
    except ValueError:
        return False
    return isinstance(summary, dict) and summary.get("status") == "failed" and not summary.get("steps_done")


MOVED_ASIDE = (METRICS, TRAJECTORY, EXACT_TRAJECTORY, DYNAMICS_PLOT, SUMMARY, CORRELATIONS, SPECTRUM,
               ENERGY_PLOT, EVALUATION, CHECKPOINT)


def move_aside(run_dir: Path) -> Path | None:
    """Moves an earlier run's records and checkpoint (`MOVED_ASIDE`) into run_dir/replaced-<UTC
    time>/, so a resume=false run starts in a clean directory without deleting them; returns that
    directory, or None when there was nothing to move (nothing is moved without a record)."""
    if not run_records(run_dir) and not checkpoint.exists(run_dir / CHECKPOINT):
        return None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target, n = run_dir / f"{REPLACED_PREFIX}{stamp}", 1
    while target.exists():
        target, n = run_dir / f"{REPLACED_PREFIX}{stamp}-{n}", n + 1
    target.mkdir()
    for name in MOVED_ASIDE:
        if (run_dir / name).exists():
            (run_dir / name).rename(target / name)
    return target


def replacing(run_dir: Path, settings) -> str | None:
    """With resume=false over a completed run: the one line that says what starting over replaces
    (the first key whose value differs from the stored summary's fingerprint, or that it reruns
    the same config); None when there is no completed run to replace."""
    path = run_dir / SUMMARY
    if settings.resume or not path.is_file():
        return None
    try:
        summary = json.loads(path.read_text())
    except ValueError:
        return None
    if summary.get("status") != "completed":
        return None
    stored = summary.get("config_fingerprint")
    stored = stored.get("config") if isinstance(stored, dict) else None
    if not isinstance(stored, dict):
        return f"resume=false: replacing the completed run in {run_dir} (its config predates fingerprints)"
    difference = fingerprint.first_difference(stored, settings.fingerprint)
    if difference is None:
        return f"resume=false: rerunning the completed run in {run_dir} with the same config"
    key, old, new = difference
    return (f"resume=false: replacing the completed run in {run_dir} "
            f"({key} was {fingerprint.show(old)}, now {fingerprint.show(new)})")


def check_run_dir(run_dir: Path, settings):
    """Refuses, before any heavy work, a run directory holding another config's run (the same
    checks as a run's skip and resume)."""
    if completed_summary(run_dir, settings) is None:
        resumable(run_dir, settings)


def remove_if_new(run_dir: Path, new_dirs):
    """Removes a run directory that did not exist before this run and holds only what Hydra wrote
    (`.hydra/` and an empty log, left by a config error), and its parents that did not either.

    Args:
        new_dirs: paths (resolved) that did not exist when the command started (`cli.new_dirs`);
            any other directory (a resumed run's, a user's) stays.
    """
    run_dir = run_dir.resolve()
    hydra_names = {Path(name).name for name in (CONFIG, OVERRIDES, HYDRA_CONFIG)}
    try:
        if run_dir not in new_dirs:
            return
        hydra_dir = run_dir / HYDRA
        hydra_files = {p.name for p in hydra_dir.iterdir()} if hydra_dir.is_dir() else set()
        only_hydra = all(p.name == HYDRA or (p.suffix == JOB_LOG_SUFFIX and p.stat().st_size == 0)
                         for p in run_dir.iterdir())
        if not (only_hydra and hydra_files <= hydra_names):
            return
        shutil.rmtree(run_dir)
        parent = run_dir.parent  # outputs/DATE of the default outputs/DATE/TIME, when new and empty
        while parent in new_dirs and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent
    except OSError:  # a directory we cannot read or remove is left as it is
        pass


def write_summary(run_dir: Path, summary: dict):
    """summary.json, atomically (a reader sees the old file or the new one, never a part): the one
    writer of a run's summary (the loop's, a failure's and a config error's)."""
    text = json.dumps(summary, indent=2) + "\n"
    checkpoint.write_atomic(run_dir / SUMMARY, lambda f: f.write(text.encode()))
