"""A sweep's runs as a printed table, one line per problem, and report.csv."""

import csv
from pathlib import Path

COLUMNS = ("status", "steps", "energy", "energy_error", "exact_energy", "relative_error", "v_score",
           "ms_per_iter", "processes", "devices", "warnings", "reason", "total_sz", "sector", "exact_sector",
           "sector_exact_energy", "sector_relative_error", "max_abs_error")
NOT_DONE = ("failed", "preempted", "interrupted")  # marked in the table, with the summary's reason


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
    dynamics = any(row.get("max_abs_error") is not None for row in rows)  # time evolutions with exact curves
    header = (keys or ["run"]) + ["status", "steps", "energy", "exact", "rel. error", "V-score",
                                  "ms/iter", "procs/devs", "warnings"] + (["max |error|"] if dynamics else [])
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
        if dynamics:
            cells[-1].append(_fmt(row.get("max_abs_error")))
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
    line = lambda cs: "  ".join(str(c).ljust(w) for c, w in zip(cs, widths)).rstrip()
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(c) for c in cells])


def observable_cells(row: dict, names: list[str]) -> list:
    """obs/NAME, obs_error/NAME and exact/NAME of each name, from the run's summary."""
    summary = row.get("summary") or {}
    observed, exact = summary.get("observables") or {}, summary.get("exact_observables") or {}
    return [cell for name in names for cell in ((observed.get(name) or {}).get("mean"),
                                                (observed.get(name) or {}).get("error"), exact.get(name))]


def write_csv(rows: list[dict], keys: list[str], path: Path) -> None:
    """All runs with their swept overrides and full-precision numbers, the observables last."""
    columns = list(COLUMNS) + (["mlflow_run_id"] if any("mlflow_run_id" in r for r in rows) else [])
    names = []
    for row in rows:
        names += [n for n in ((row.get("summary") or {}).get("observables") or {}) if n not in names]
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["run"] + keys + columns + [f"{kind}/{n}" for n in names for kind in ("obs", "obs_error", "exact")])
        for row in rows:
            writer.writerow([row["run"]] + [row["overrides"].get(k, "") for k in keys]
                            + [_csv_cell(row.get(c)) for c in columns]
                            + [_csv_cell(v) for v in observable_cells(row, names)])


def _csv_cell(value):
    if value is None:
        return ""
    return ";".join(value) if isinstance(value, list) else value
