"""`python -m runner.report DIR`: every run under DIR in one table (printed, CSV) and plots."""

import argparse
import json
import math
import os
import re
import sys
import time
from pathlib import Path

import yaml

from runner.lifecycle import rundir, sector_check
from runner.outputs import sector_spectrum, structure_factor_plot
from runner.outputs.loggers import MLFLOW_DB, TENSORBOARD_DIR, TRACKING_DIRS
from runner.outputs.sweep_plots import (
    as_float,
    plot_convergence,
    plot_energy,
    plot_observables,
    energy_unit,
    plot_sweep,
    run_label,
)
from runner.outputs.sweep_table import format_table, problems, table, write_csv
from runner.outputs.trajectory_plot import plot_trajectories

RUNNING_IF_WRITTEN_WITHIN_S = 120  # no summary, metrics this fresh: probably still running
# what runner.app logs (into the run's Hydra job log, from any rank) when a process raises
FAILED_LINE = re.compile(r"\] - process \d+ of \d+ failed$", re.M)
# What the report writes into the directory it reports on (observables.png is rundir.OBSERVABLES_PLOT).
REPORT_CSV, RELATIVE_ERROR_PLOT, CONVERGENCE_PLOT = "report.csv", "report.png", "convergence.png"
ENERGY_PLOT, STRUCTURE_FACTOR_PLOT = "sweep_energy.png", "structure_factor.png"
SPECTRUM_PLOT, GAPS_CSV = "sector_spectrum.png", "gaps.csv"
DYNAMICS_PLOT = "sweep_dynamics.png"  # the time evolutions of the runs, one curve each


def find_runs(root: Path) -> list[Path]:
    """Run directories under `root` (itself included): those with a summary, metrics or Hydra record.

    Hidden folders (`.submitit`, `.hydra`), checkpoints and the trackers' folders (`tensorboard`,
    `mlartifacts`, whose copies of summary.json are no runs) are not searched.
    """
    runs = []
    for here, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in (rundir.CHECKPOINT, *TRACKING_DIRS))
        here = Path(here)
        if rundir.SUMMARY in files or rundir.METRICS in files or (here / rundir.OVERRIDES).is_file():
            runs.append(here)
    return runs


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _read_metrics(path: Path) -> list[dict]:
    records = []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return records
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:  # a line cut short by a killed writer
            continue
    return records


def _read_overrides(run: Path) -> dict[str, str]:
    """`key=value` overrides of a Hydra run (group choices included), as strings."""
    try:
        items = yaml.safe_load((run / rundir.OVERRIDES).read_text()) or []
    except (OSError, ValueError):
        return {}
    out = {}
    for item in items:
        key, sep, value = str(item).partition("=")
        if sep:
            out[key.lstrip("+~")] = value
    return out


def _read_config(run: Path) -> dict:
    """The run's resolved config (`.hydra/config.yaml`), empty when unreadable."""
    try:
        config = yaml.safe_load((run / rundir.CONFIG).read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def _failed_in_log(run: Path) -> bool:
    """The Hydra job log (`<job name>.log`, shared by all ranks) records a failed process."""
    for log in run.glob(f"*{rundir.JOB_LOG_SUFFIX}"):
        try:
            text = log.read_text(errors="replace")
        except OSError:
            continue
        if FAILED_LINE.search(text):
            return True
    return False


def _status_without_summary(run: Path, records: list[dict], written: Path) -> str:
    """A run with no summary failed on some rank, was killed, is running, or has not started
    (`records` read from `written`: metrics.jsonl, or trajectory.jsonl of a time evolution)."""
    if _failed_in_log(run):
        return "failed"
    if not records:
        return "started" if (run / rundir.OVERRIDES).is_file() else "unknown"
    age = time.time() - written.stat().st_mtime
    return "running" if age < RUNNING_IF_WRITTEN_WITHIN_S else "incomplete"


def collect(root: Path) -> list[dict]:
    """One row per run: its overrides (`overrides`), the table columns, its metrics (`records`),
    summary (`summary`, empty without one), `total_sz` (from its config), and the contents of its
    correlations.json (`correlations`) and spectrum.json (`spectrum`), None where absent."""
    rows = []
    for run in find_runs(root):
        summary = _read_json(run / rundir.SUMMARY) or {}
        records = _read_metrics(run / rundir.METRICS)
        trajectory = _read_metrics(run / rundir.TRAJECTORY)
        config = _read_config(run)
        n_iter = summary.get("n_iter", config.get("n_iter"))
        done = summary.get("steps_done", len(records))
        if trajectory or summary.get("task") == "dynamics":
            steps = f"t {_time(summary.get('t_reached', trajectory[-1]['t'] if trajectory else None))}" \
                    f"/{_time(summary.get('t_end', (config.get('task') or {}).get('t_end')))}"
        else:
            steps = f"{done}/{n_iter}" if n_iter is not None else str(done)
        row = {
            "run": "." if run == root else str(run.relative_to(root)),
            "path": run,
            "overrides": _read_overrides(run),
            "records": records,
            "summary": summary,
            "status": summary.get("status") or _status_without_summary(
                run, records or trajectory, run / (rundir.METRICS if records else rundir.TRAJECTORY)),
            "steps": steps,
            "warnings": [w.get("name", "?") for w in summary.get("warnings") or []],
            "warning_messages": [w.get("message", "") for w in summary.get("warnings") or []],
            "reason": summary.get("reason"),
            "total_sz": (config.get("hilbert") or {}).get("total_sz"),
            "correlations": _read_json(run / rundir.CORRELATIONS),
            "spectrum": _read_json(run / rundir.SPECTRUM),
            "trajectory": trajectory,
            "exact_trajectory": _read_json(run / rundir.EXACT_TRAJECTORY),
            "max_abs_error": _largest_error(summary.get("max_abs_error")),
        }
        if summary:
            for key in ("energy", "energy_error", "exact_energy", "relative_error", "v_score",
                        "processes", "devices", *sector_check.FIELDS):
                row[key] = summary.get(key)
            spi = summary.get("seconds_per_iter")
            row["ms_per_iter"] = 1e3 * spi if spi is not None else None
        elif records or trajectory:  # the latest estimate, for a run that has not finished
            row["energy"] = (records or trajectory)[-1].get("energy")
            row["energy_error"] = (records or trajectory)[-1].get("energy_error")
        exact, energy = row.get("exact_energy"), row.get("energy")
        if row.get("relative_error") is None and exact and energy is not None:
            row["relative_error"] = abs(energy - exact) / abs(exact)
        rows.append(row)
    return rows


def _largest_error(errors: dict | None) -> float | None:
    """A time evolution's largest |error| against exact over its observables (the energy's where it
    measures none), from summary.json's max_abs_error; None without exact values."""
    known = {k: v for k, v in (errors or {}).items() if v is not None}
    observed = [v for k, v in known.items() if k.startswith("obs/")]
    return max(observed) if observed else known.get("energy")


def _time(t) -> str:
    return "-" if t is None else f"{t:g}"


def swept_keys(rows: list[dict]) -> list[str]:
    """Override keys whose value differs between runs (in first-seen order)."""
    keys = []
    for row in rows:
        keys += [k for k in row["overrides"] if k not in keys]
    return [k for k in keys if len({row["overrides"].get(k) for row in rows}) > 1]


def _sort_key(row):
    # Hydra's sweep subdirs start with the job number: 0_..., 1_..., 10_...
    head = row["run"].split("/")[-1].split("_")[0]
    return (int(head) if head.isdigit() else math.inf, row["run"])


def mlflow_runs(store: Path) -> dict[Path, dict]:
    """The MLflow runs of a SQLite store (read with MlflowClient), by the run directory they track.

    Returns:
        {resolved run directory: {"run_id", "experiment", "status", "metrics"}}; empty when mlflow
        is not installed.
    """
    try:
        from mlflow.tracking import MlflowClient
    except ImportError:
        return {}
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    client = MlflowClient(tracking_uri=f"sqlite:///{store.resolve()}")
    found = {}
    for experiment in client.search_experiments():
        for run in client.search_runs([experiment.experiment_id], max_results=50000):
            run_dir = run.data.tags.get("run_dir")
            if run_dir:
                found[Path(run_dir).resolve()] = {"run_id": run.info.run_id, "experiment": experiment.name,
                                                  "status": run.info.status, "metrics": dict(run.data.metrics)}
    return found


def tracking_lines(root: Path, rows: list[dict]) -> list[str]:
    """Where the runs were also tracked: the MLflow stores (queried) and TensorBoard event folders.

    Sets each tracked row's `mlflow_run_id` (also a CSV column).
    """
    lines = []
    stores = sorted({p for p in [root / MLFLOW_DB, *(r["path"] / MLFLOW_DB for r in rows)] if p.is_file()})
    for store in stores:
        tracked = mlflow_runs(store)
        for row in rows:
            entry = tracked.get(row["path"].resolve())
            if entry is not None:
                row["mlflow_run_id"] = entry["run_id"]
        mine = sum(row["path"].resolve() in tracked for row in rows)
        lines.append(f"mlflow: {mine} of {len(rows)} run(s) in {store} "
                     f"(mlflow ui --backend-store-uri sqlite:///{store.resolve()})")
    boards = [r for r in rows if (r["path"] / TENSORBOARD_DIR).is_dir()]
    if boards:
        lines.append(f"tensorboard: {len(boards)} of {len(rows)} run(s) (tensorboard --logdir {root})")
    return lines


def _plots(root: Path, rows: list[dict], keys: list[str], point: str | None) -> list[Path]:
    """Writes the plots that apply (`report`; nothing against a key that chooses a sector in a
    sweep over sectors: `sector_spectrum` draws those); returns their paths."""
    written = []
    sectors = bool(sector_spectrum.groups(rows, keys))
    numeric = [k for k in keys if all(as_float(r["overrides"].get(k)) is not None for r in rows)
               and not (sectors and sector_spectrum.is_sector_key(k))]
    if len(keys) == 1 and numeric and plot_sweep(rows, keys[0], root / RELATIVE_ERROR_PLOT) is not None:
        written.append(root / RELATIVE_ERROR_PLOT)
    if plot_convergence(rows, keys, root / CONVERGENCE_PLOT) is not None:
        written.append(root / CONVERGENCE_PLOT)
    for key in numeric:  # energy and observables against each numeric swept key
        suffix = "" if len(numeric) == 1 else f"_{key}"
        for plot, name in ((plot_energy, ENERGY_PLOT), (plot_observables, rundir.OBSERVABLES_PLOT)):
            target = root / name.replace(".png", f"{suffix}.png")
            if plot(rows, key, keys, target) is not None:
                written.append(target)
    dynamics = [(run_label(r, keys), r["trajectory"], r["exact_trajectory"]) for r in rows]
    unit = energy_unit([r for r in rows if r["trajectory"]])
    if plot_trajectories(dynamics, root / DYNAMICS_PLOT, unit=unit) is not None:
        written.append(root / DYNAMICS_PLOT)
    runs = structure_factor_plot.chosen(rows, point)
    if point is not None and not runs:
        print(f"no completed run {point!r} with S(q) under {root}")
    labels = [run_label(r, keys) for r in runs]
    if structure_factor_plot.plot_structure_factor(runs, labels, root / STRUCTURE_FACTOR_PLOT) is not None:
        written.append(root / STRUCTURE_FACTOR_PLOT)
    return written


def _sectors(root: Path, rows: list[dict], keys: list[str], plots: bool) -> list[Path]:
    """For a sweep over sectors: prints and writes the gaps, draws the spectrum of each group."""
    found = sector_spectrum.groups(rows, keys)
    if not found:
        return []
    tables = {label: sector_spectrum.gaps(runs) for label, runs in found.items()}
    print("\n" + "\n\n".join(sector_spectrum.format_gaps(label, t) for label, t in tables.items()))
    sector_spectrum.write_gaps(tables, root / GAPS_CSV)
    written = [root / GAPS_CSV]
    for i, runs in enumerate(found.values() if plots else []):
        target = root / (SPECTRUM_PLOT if len(found) == 1 else SPECTRUM_PLOT.replace(".png", f"_{i}.png"))
        if sector_spectrum.plot_spectrum(runs, target) is not None:
            written.append(target)
    return written


def report(root: Path, plots: bool = True, point: str | None = None) -> list[dict]:
    """Prints the table (and a sector sweep's gaps), writes report.csv and the plots into `root`.

    Args:
        point: the run (its `run` column) whose S(q) is drawn; None: up to
            `structure_factor_plot.MAX_RUNS` runs.

    Returns:
        The rows, one per run (empty when `root` holds no run).
    """
    rows = sorted(collect(root), key=_sort_key)
    if not rows:
        return rows
    keys = swept_keys(rows)
    print(format_table(*table(rows, keys)))
    counts = {}
    for row in rows:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    print(f"\n{len(rows)} run(s): " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    noted = problems(rows)
    if noted:
        print("\n".join(["", *noted]))
    tracked = tracking_lines(root, rows)
    if tracked:
        print("\n".join(["", *tracked]))
    write_csv(rows, keys, root / REPORT_CSV)
    written = [root / REPORT_CSV, *_sectors(root, rows, keys, plots)]
    if plots:
        written += _plots(root, rows, keys, point)
    print("wrote " + ", ".join(str(p) for p in written))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runner.report", description=__doc__)
    parser.add_argument("dir", type=Path, help="a run directory or a sweep directory")
    parser.add_argument("--no-plots", action="store_true", help="only the table and the CSVs")
    parser.add_argument("--point", metavar="RUN", help="draw S(q) of this run only (its directory under DIR)")
    args = parser.parse_args(argv)
    if not args.dir.is_dir():
        print(f"Error: {args.dir} is not a directory.", file=sys.stderr)
        return 2
    if not report(args.dir, plots=not args.no_plots, point=args.point):
        print(f"Error: no runs under {args.dir} (no {rundir.SUMMARY}, {rundir.METRICS} or {rundir.OVERRIDES}).",
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
