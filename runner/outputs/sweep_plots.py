"""A sweep's plots against the swept key: relative error, energy, observables; and convergence."""

from pathlib import Path

import numpy as np

from runner.outputs.plot import energy_label, log_error_bars

ZERO_TOLERANCE = 1e-10  # an observable whose means, errors and exact values are all below this is zero


def pyplot():
    """matplotlib.pyplot on the Agg backend (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def as_float(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def energy_unit(rows: list[dict]) -> str | None:
    """The unit of the runs' energies (their summaries' `energy_unit`): the one they share, several
    joined by " / ", None where no summary names one (a run written before the unit was recorded)."""
    units = sorted({u for r in rows if (u := (r.get("summary") or {}).get("energy_unit"))})
    return " / ".join(units) or None


class EnergyAxis:
    """How a plot draws the runs' energies: per site when they are of several sizes (their totals
    would not compare), else totals, with a per-site axis on the right when they share one size;
    the axis label names the unit. Totals alone where a run's size is unknown (no summary)."""

    def __init__(self, rows: list[dict]):
        counts = {(r.get("summary") or {}).get("n_sites") for r in rows}
        known = bool(counts) and None not in counts
        self.per_site = known and len(counts) > 1
        self.n_sites = counts.pop() if known and len(counts) == 1 else None
        self.unit = energy_unit(rows)

    def scale(self, row: dict) -> float:
        """What a run's energies are divided by: its sites when drawn per site, else 1."""
        return row["summary"]["n_sites"] if self.per_site else 1

    def label(self, ax):
        """The energy axis's label with the unit (and the per-site axis on the right)."""
        label = energy_label(self.unit)
        ax.set_ylabel(label.replace("energy", "energy per site", 1) if self.per_site else label)
        if self.n_sites:
            n = self.n_sites
            right = ax.secondary_yaxis("right", functions=(lambda e: e / n, lambda e: e * n))
            right.set_ylabel(f"energy per site (N = {n})")


def run_label(row: dict, keys: list[str]) -> str:
    """A run's name in a legend: its values of the swept `keys`, else its directory under the
    report's root, or the root's own name (resolved: `python -m runner.report .` names no run ".")."""
    values = ", ".join(f"{k}={row['overrides'].get(k, '-')}" for k in keys)
    return values or (Path(row["path"]).resolve().name if row["run"] == "." else row["run"])


def plot_sweep(rows: list[dict], key: str, path: Path):
    """Relative error (when every finished run has one) or energy against the swept `key`, with
    the energy's error bars.

    Returns:
        The matplotlib Figure (closed; written to `path`), or None when no run has an energy.
    """
    plt = pyplot()
    points = [(as_float(r["overrides"].get(key)), r) for r in rows if r.get("energy") is not None
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
        axis = EnergyAxis([r for _, r in points])
        ax.errorbar(xs, [r["energy"] / axis.scale(r) for _, r in points],
                    yerr=[(r.get("energy_error") or 0.0) / axis.scale(r) for _, r in points], fmt="o-", capsize=3)
        exact = [(x, r["exact_energy"] / axis.scale(r)) for x, r in points if r.get("exact_energy") is not None]
        if exact:
            ax.plot(*zip(*exact), "k--", label="exact")
            ax.legend()
        axis.label(ax)
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
    plt = pyplot()
    curves = [r for r in rows if any(rec.get("energy") is not None for rec in r["records"])]
    if not curves:
        return None
    with_exact = [r for r in curves if r.get("exact_energy")]
    axis = EnergyAxis(curves)
    fig, axes = plt.subplots(1, 2 if with_exact else 1, figsize=(11 if with_exact else 6.5, 4), squeeze=False)
    for row in curves:
        label = run_label(row, keys)
        kept = [rec for rec in row["records"] if rec.get("energy") is not None]
        steps = np.array([rec["step"] for rec in kept])
        energy = np.array([rec["energy"] for rec in kept])
        error = np.array([rec.get("energy_error") or 0.0 for rec in kept])
        scale = axis.scale(row)
        (line,) = axes[0, 0].plot(steps, energy / scale, lw=1, label=label)
        axes[0, 0].fill_between(steps, (energy - error) / scale, (energy + error) / scale, color=line.get_color(),
                                alpha=0.25, lw=0)
        if row.get("exact_energy"):
            exact = row["exact_energy"]
            axes[0, 0].axhline(exact / scale, color=line.get_color(), ls="--", lw=0.8)
            rel = np.maximum(np.abs(energy - exact) / abs(exact), 1e-16)
            axes[0, 1].errorbar(steps, rel, yerr=log_error_bars(rel, error / abs(exact)), lw=1,
                                elinewidth=0.5, color=line.get_color(), label=label)
    axes[0, 0].set_xlabel("step")
    axis.label(axes[0, 0])
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


def _curves(rows: list[dict], key: str, keys: list[str]) -> dict[str, list[tuple[float, dict]]]:
    """The completed runs with a numeric `key`, sorted along it, by the values of the other swept
    keys: {label: [(x, row)]}."""
    curves = {}
    for row in rows:
        x = as_float(row["overrides"].get(key))
        if x is not None and row["status"] == "completed":
            label = ", ".join(f"{k}={row['overrides'].get(k, '-')}" for k in keys if k != key)
            curves.setdefault(label, []).append((x, row))
    return {label: sorted(points, key=lambda p: p[0]) for label, points in curves.items()}


def plot_energy(rows: list[dict], key: str, keys: list[str], path: Path):
    """The energy with its error bars against the swept `key`, one curve per value of the other
    swept keys, with the exact ground energy (dashed) and, where it differs, the lowest exact level
    the model's sector can reach (dotted) in the curve's colour.

    Returns:
        The matplotlib Figure (closed; written to `path`), or None when no completed run with a
        numeric `key` has an energy.
    """
    plt = pyplot()
    curves = {label: [(x, r) for x, r in points if r.get("energy") is not None]
              for label, points in _curves(rows, key, keys).items()}
    curves = {label: points for label, points in curves.items() if points}
    if not curves:
        return None
    axis = EnergyAxis([r for points in curves.values() for _, r in points])
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for label, points in curves.items():
        xs = [x for x, _ in points]
        bars = ax.errorbar(xs, [r["energy"] / axis.scale(r) for _, r in points],
                           yerr=[(r.get("energy_error") or 0.0) / axis.scale(r) for _, r in points],
                           fmt="o-", capsize=3, ms=4, label=label or "VMC")
        color = bars.lines[0].get_color()
        for field, style, name in (("exact_energy", "--", "exact"), ("sector_exact_energy", ":", "exact in sector")):
            known = [(x, r[field], r) for x, r in points if r.get(field) is not None]
            if field == "sector_exact_energy":
                known = [(x, e, r) for x, e, r in known if e != r.get("exact_energy")]
            if known:
                ax.plot([x for x, _, _ in known], [e / axis.scale(r) for _, e, r in known], style, color=color, lw=1,
                        label=f"{name}, {label}" if label else name)
    ax.set_xlabel(key)
    axis.label(ax)
    ax.grid(alpha=0.3)
    if len(ax.get_legend_handles_labels()[1]) <= 12:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return fig


def is_zero(points, tolerance: float = ZERO_TOLERANCE) -> bool:
    """Whether every (mean, error, exact or None) of an observable is within `tolerance` of zero:
    a panel that symmetry keeps at zero (M_z and M_z^2 at total_sz = 0)."""
    return all(abs(m) <= tolerance and abs(e) <= tolerance and (x is None or abs(x) <= tolerance)
               for m, e, x in points)


def _observed(curves) -> dict[str, dict[str, list]]:
    """{name: {label: [(x, mean, error, exact or None)]}} of the runs' summaries."""
    out = {}
    for label, points in curves.items():
        for x, row in points:
            exact = row.get("summary", {}).get("exact_observables") or {}
            for name, value in (row.get("summary", {}).get("observables") or {}).items():
                if value.get("mean") is not None:
                    out.setdefault(name, {}).setdefault(label, []).append(
                        (x, value["mean"], value.get("error") or 0.0, exact.get(name)))
    return out


def plot_observables(rows: list[dict], key: str, keys: list[str], path: Path):
    """Every observable of the runs' summaries (with error bars) against the swept `key`, one
    panel per observable, one curve per value of the other swept keys, the exact values
    (`exact_observables`) as crosses on a dashed line; observables zero over the whole sweep
    (`is_zero`) get no panel.

    Returns:
        The matplotlib Figure (closed; written to `path`), or None when no completed run with a
        numeric `key` has an observable that is not zero.
    """
    plt = pyplot()
    observed = _observed(_curves(rows, key, keys))
    observed = {name: by_label for name, by_label in observed.items()
                if not is_zero([p[1:] for points in by_label.values() for p in points])}
    if not observed:
        return None
    cols = min(3, len(observed))
    n_rows = -(-len(observed) // cols)
    fig, axes = plt.subplots(n_rows, cols, figsize=(4.2 * cols, 3.2 * n_rows), squeeze=False)
    for ax, (name, by_label) in zip(axes.flat, observed.items()):
        for label, points in by_label.items():
            xs, means, errors, exact = zip(*points)
            bars = ax.errorbar(xs, means, yerr=errors, fmt="o-", capsize=3, ms=4, label=label or None)
            known = [(x, e) for x, e in zip(xs, exact) if e is not None]
            if known:
                ax.plot(*zip(*known), "x--", color=bars.lines[0].get_color(), lw=1,
                        label=f"exact, {label}" if label else "exact")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel(key)
        ax.grid(alpha=0.3)
        if len(by_label) <= 6 and ax.get_legend_handles_labels()[1]:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(observed):]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return fig
