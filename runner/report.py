"""`python -m runner.report DIR`: every run under DIR in one table (printed, CSV) and two plots."""

import argparse
import csv
import json
import math
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

from runner.lifecycle import rundir
from runner.outputs.loggers import MLFLOW_DB, TENSORBOARD_DIR, TRACKING_DIRS
from runner.outputs.plot import log_error_bars

RUNNING_IF_WRITTEN_WITHIN_S = 120  # no summary, metrics this fresh: probably still running
# what runner.app logs (into the run's Hydra job log, from any rank) when a process raises
FAILED_LINE = re.compile(r"\] - process \d+ of \d+ failed$", re.M)

COLUMNS = ("status", "steps", "energy", "energy_error", "exact_energy", "relative_error", "v_score",
           "ms_per_iter", "processes", "devices", "warnings", "reason")
NOT_DONE = ("failed", "preempted", "interrupted")  # marked in the table, with the summary's reason


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
        import yaml

        items = yaml.safe_load((run / rundir.OVERRIDES).read_text()) or []
    except (OSError, ImportError, ValueError):
        return {}
    out = {}
    for item in items:
        key, sep, value = str(item).partition("=")
        if sep:
            out[key.lstrip("+~")] = value
    return out


def _configured_n_iter(run: Path):
    try:
        import yaml

        return (yaml.safe_load((run / rundir.CONFIG).read_text()) or {}).get("n_iter")
    except (OSError, ImportError, ValueError, AttributeError):
        return None


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


def _status_without_summary(run: Path, records: list[dict]) -> str:
    """A run with no summary failed on some rank, was killed, is running, or has not started."""
    if _failed_in_log(run):
        return "failed"
    if not records:
        return "started" if (run / rundir.OVERRIDES).is_file() else "unknown"
    age = time.time() - (run / rundir.METRICS).stat().st_mtime
    return "running" if age < RUNNING_IF_WRITTEN_WITHIN_S else "incomplete"


def collect(root: Path) -> list[dict]:
    """One row per run: its overrides (`overrides`), the table columns and its metrics (`records`)."""
    rows = []
    for run in find_runs(root):
        summary = _read_json(run / rundir.SUMMARY) or {}
        records = _read_metrics(run / rundir.METRICS)
        n_iter = summary.get("n_iter", _configured_n_iter(run))
        done = summary.get("steps_done", len(records))
        row = {
            "run": "." if run == root else str(run.relative_to(root)),
            "path": run,
            "overrides": _read_overrides(run),
            "records": records,
            "status": summary.get("status") or _status_without_summary(run, records),
            "steps": f"{done}/{n_iter}" if n_iter is not None else str(done),
            "warnings": [w.get("name", "?") for w in summary.get("warnings") or []],
            "warning_messages": [w.get("message", "") for w in summary.get("warnings") or []],
            "reason": summary.get("reason"),
        }
        if summary:
            for key in ("energy", "energy_error", "exact_energy", "relative_error", "v_score",
                        "processes", "devices"):
                row[key] = summary.get(key)
            spi = summary.get("seconds_per_iter")
            row["ms_per_iter"] = 1e3 * spi if spi is not None else None
        elif records:  # the latest step's estimate, for a run that has not finished
            row["energy"] = records[-1].get("energy")
            row["energy_error"] = records[-1].get("energy_error")
        exact, energy = row.get("exact_energy"), row.get("energy")
        if row.get("relative_error") is None and exact and energy is not None:
            row["relative_error"] = abs(energy - exact) / abs(exact)
        rows.append(row)
    return rows


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


def _fmt(value, kind=None):
    if value is None:
        return "-"
    if isinstance(value, float):
        if kind == "energy":
            return f"{value:.8f}"
        if kind == "ms":
            return f"{value:.2f}"
        return f"{value:.2e}"
    return str(value)


def table(rows: list[dict], keys: list[str]) -> tuple[list[str], list[list[str]]]:
    """Header and text cells of the printed table."""
    header = (keys or ["run"]) + ["status", "steps", "energy", "exact", "rel. error", "V-score",
                                  "ms/iter", "procs/devs", "warnings"]
    cells = []
    for row in rows:
        energy = row.get("energy")
        if energy is not None and row.get("energy_error") is not None:
            energy_text = f"{energy:.8f} ± {row['energy_error']:.1e}"
        else:
            energy_text = _fmt(energy, "energy")
        procs = f"{_fmt(row.get('processes'))}/{_fmt(row.get('devices'))}"
        cells.append([row["overrides"].get(k, "-") for k in keys] if keys else [row["run"]])
        status = f"{row['status']} !" if row["status"] in NOT_DONE else row["status"]
        cells[-1] += [status, row["steps"], energy_text, _fmt(row.get("exact_energy"), "energy"),
                      _fmt(row.get("relative_error")), _fmt(row.get("v_score")),
                      _fmt(row.get("ms_per_iter"), "ms"), procs, ",".join(row.get("warnings") or []) or "-"]
    return header, cells


def problems(rows: list[dict]) -> list[str]:
    """One line per run that did not complete (with its reason) and per health warning."""
    lines = []
    for row in rows:
        if row["status"] in NOT_DONE:
            lines.append(f"! {row['run']}: {row['status']}: {row.get('reason') or 'no reason recorded'}")
        for name, message in zip(row.get("warnings") or [], row.get("warning_messages") or []):
            lines.append(f"  {row['run']}: warning [{name}]: {message}")
    return lines


def format_table(header, cells) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *cells)]
    line = lambda cs: "  ".join(str(c).ljust(w) for c, w in zip(cs, widths)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(c) for c in cells])


def write_csv(rows: list[dict], keys: list[str], path: Path) -> None:
    """All runs with their swept overrides and full-precision numbers."""
    columns = list(COLUMNS) + (["mlflow_run_id"] if any("mlflow_run_id" in r for r in rows) else [])
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["run"] + keys + columns)
        for row in rows:
            writer.writerow([row["run"]] + [row["overrides"].get(k, "") for k in keys]
                            + [_csv_cell(row.get(c)) for c in columns])


def _csv_cell(value):
    if value is None:
        return ""
    return ";".join(value) if isinstance(value, list) else value


def _as_float(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def plot_sweep(rows: list[dict], key: str, path: Path):
    """Relative error (when every finished run has one) or energy against the swept `key`, with
    the energy's error bars.

    Returns:
        The matplotlib Figure (closed; written to `path`), or None when no run has an energy.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [(_as_float(r["overrides"].get(key)), r) for r in rows if r.get("energy") is not None
              and r["status"] == "completed"]
    points = sorted((x, r) for x, r in points if x is not None) if points else []
    if not points:
        return None
    xs = [x for x, _ in points]
    fig, ax = plt.subplots(figsize=(6, 4))
    if all(r.get("relative_error") is not None for _, r in points):
        rel = np.array([max(r["relative_error"], 1e-16) for _, r in points])
        rel_error = np.array([(r.get("energy_error") or 0.0) / abs(r["exact_energy"]) if r.get("exact_energy")
                              else 0.0 for _, r in points])
        ax.errorbar(xs, rel, yerr=log_error_bars(rel, rel_error), fmt="o-", capsize=3)
        ax.set_yscale("log")
        ax.set_ylabel("relative error")
    else:
        ax.errorbar(xs, [r["energy"] for _, r in points],
                    yerr=[r.get("energy_error") or 0.0 for _, r in points], fmt="o-", capsize=3)
        exact = [(x, r["exact_energy"]) for x, r in points if r.get("exact_energy") is not None]
        if exact:
            ax.plot(*zip(*exact), "k--", label="exact")
            ax.legend()
        ax.set_ylabel("energy")
    ax.set_xlabel(key)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return fig


def plot_convergence(rows: list[dict], keys: list[str], path: Path):
    """Energy against step for every run with metrics (with an error band); relative error with
    error bars too when the exact energy is known.

    Returns:
        The matplotlib Figure (closed; written to `path`), or None when no run has metrics.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = [r for r in rows if any(rec.get("energy") is not None for rec in r["records"])]
    if not curves:
        return None
    with_exact = [r for r in curves if r.get("exact_energy")]
    fig, axes = plt.subplots(1, 2 if with_exact else 1, figsize=(11 if with_exact else 6.5, 4), squeeze=False)
    for row in curves:
        label = ", ".join(f"{k}={row['overrides'].get(k, '-')}" for k in keys) or row["run"]
        kept = [rec for rec in row["records"] if rec.get("energy") is not None]
        steps = np.array([rec["step"] for rec in kept])
        energy = np.array([rec["energy"] for rec in kept])
        error = np.array([rec.get("energy_error") or 0.0 for rec in kept])
        (line,) = axes[0, 0].plot(steps, energy, lw=1, label=label)
        axes[0, 0].fill_between(steps, energy - error, energy + error, color=line.get_color(), alpha=0.25, lw=0)
        if row.get("exact_energy"):
            exact = row["exact_energy"]
            axes[0, 0].axhline(exact, color=line.get_color(), ls="--", lw=0.8)
            rel = np.maximum(np.abs(energy - exact) / abs(exact), 1e-16)
            axes[0, 1].errorbar(steps, rel, yerr=log_error_bars(rel, error / abs(exact)), lw=1,
                                elinewidth=0.5, color=line.get_color(), label=label)
    axes[0, 0].set_xlabel("step")
    axes[0, 0].set_ylabel("energy")
    if with_exact:
        axes[0, 1].set_yscale("log")
        axes[0, 1].set_xlabel("step")
        axes[0, 1].set_ylabel("relative error")
    if len(curves) <= 12:
        axes[0, 0].legend(fontsize=7)
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return fig


def plot_observables(rows: list[dict], key: str, keys: list[str], path: Path):
    """Every observable of the runs' summaries (with error bars) against the swept `key`, one
    panel per observable, one curve per value of the other swept keys.

    Returns:
        The matplotlib Figure (closed; written to `path`), or None when no completed run with a
        numeric `key` has observables.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves, names = {}, []
    for row in rows:
        x = _as_float(row["overrides"].get(key))
        observed = (_read_json(row["path"] / rundir.SUMMARY) or {}).get("observables") or {}
        if x is None or row["status"] != "completed" or not observed:
            continue
        label = ", ".join(f"{k}={row['overrides'].get(k, '-')}" for k in keys if k != key)
        for name, value in observed.items():
            if value.get("mean") is not None:
                names += [name] if name not in names else []
                curves.setdefault(label, {}).setdefault(name, []).append((x, value["mean"], value.get("error") or 0.0))
    if not names:
        return None
    cols = min(3, len(names))
    n_rows = -(-len(names) // cols)
    fig, axes = plt.subplots(n_rows, cols, figsize=(4.2 * cols, 3.2 * n_rows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        for label, by_name in curves.items():
            points = sorted(by_name.get(name, []))
            if points:
                xs, means, errors = zip(*points)
                ax.errorbar(xs, means, yerr=errors, fmt="o-", capsize=3, ms=4, label=label or None)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel(key)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(names):]:
        ax.set_visible(False)
    if len(curves) > 1 and len(curves) <= 12:
        axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return fig


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


def report(root: Path, plots: bool = True) -> list[dict]:
    """Prints the table, writes report.csv (and report.png, convergence.png) into `root`.

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
    write_csv(rows, keys, root / "report.csv")
    written = [root / "report.csv"]
    if plots:
        numeric = [k for k in keys if all(_as_float(r["overrides"].get(k)) is not None for r in rows)]
        if len(keys) == 1 and numeric and plot_sweep(rows, keys[0], root / "report.png") is not None:
            written.append(root / "report.png")
        if plot_convergence(rows, keys, root / "convergence.png") is not None:
            written.append(root / "convergence.png")
        for key in numeric:  # observables against each numeric swept key
            target = root / (rundir.OBSERVABLES_PLOT if len(numeric) == 1 else f"observables_{key}.png")
            if plot_observables(rows, key, keys, target) is not None:
                written.append(target)
    print("wrote " + ", ".join(str(p) for p in written))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runner.report", description=__doc__)
    parser.add_argument("dir", type=Path, help="a run directory or a sweep directory")
    parser.add_argument("--no-plots", action="store_true", help="only the table and the CSV")
    args = parser.parse_args(argv)
    if not args.dir.is_dir():
        print(f"Error: {args.dir} is not a directory.", file=sys.stderr)
        return 2
    if not report(args.dir, plots=not args.no_plots):
        print(f"Error: no runs under {args.dir} (no {rundir.SUMMARY}, {rundir.METRICS} or {rundir.OVERRIDES}).",
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
