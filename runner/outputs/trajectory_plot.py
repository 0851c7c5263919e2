"""The plots of time evolutions: one run's energy and observables against t (`plot_trajectory`),
and a sweep's runs side by side, one curve per run (`plot_trajectories`); exact curves where known."""

from pathlib import Path

import numpy as np


def quantities(records: list[dict]) -> list[str]:
    """What a trajectory records against t: "energy", then each `obs/<name>` of its first record."""
    return ["energy"] + [k for k in (records[0] if records else {}) if k.startswith("obs/") and not k.endswith("_error")]


def _series(records: list[dict], name: str):
    """(t, value, error) arrays of `name` over `records` (missing values NaN, missing errors 0)."""
    t_T = np.array([r["t"] for r in records], float)
    value = np.array([np.nan if r.get(name) is None else r[name] for r in records], float)
    error = np.array([r.get(f"{name}_error") or 0.0 for r in records], float)
    return t_T, value, error


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


CONSTANT_TOLERANCE = 1e-10  # relative to the curves' scale (at least 1): spread below it is rounding noise


def constant(records: list[dict], exact: dict | None, name: str, tolerance: float = CONSTANT_TOLERANCE) -> bool:
    """Whether `name` stays constant (zero included) over t in both the TDVP and the exact curves:
    each one's spread max - min within `tolerance` of the largest |value| (or of 1, when smaller).
    A quantity zero or conserved by symmetry (M_z under a transverse field: 1e-16 noise) says
    nothing against t."""
    curves = [_series(records, name)[1]]
    if exact is not None and name in exact:
        curves.append(np.array([np.nan if x is None else x for x in exact[name]], float))
    curves = [c[np.isfinite(c)] for c in curves]
    if not any(len(c) for c in curves):
        return False
    scale = max([1.0] + [float(np.max(np.abs(c))) for c in curves if len(c)])
    return all(len(c) == 0 or np.ptp(c) <= tolerance * scale for c in curves)


CONSERVED_TOLERANCE = 1e-4  # relative spread of an energy below which its panel shows E(t) - E(0)


def conserved_energy(records: list[dict], exact: dict | None, tolerance: float = CONSERVED_TOLERANCE) -> float | None:
    """E(0), the first measured energy, where the energy is conserved: the spread of the TDVP and
    the exact curves within `tolerance` of |E(0)| (plain E(t) would need matplotlib's offset label,
    "1e-9-7.99999999", to show it); None otherwise (an imaginary-time run, a noisy estimate)."""
    energy = _series(records, "energy")[1]
    curves = [energy] + ([np.array([np.nan if x is None else x for x in exact["energy"]], float)]
                         if exact is not None and "energy" in exact else [])
    curves = np.concatenate(curves)
    finite = energy[np.isfinite(energy)]
    if not len(finite) or not np.isfinite(curves).any():
        return None
    start = float(finite[0])
    return start if np.nanmax(curves) - np.nanmin(curves) <= tolerance * max(abs(start), 1.0) else None


def _label(name: str, unit: str | None, shifted: bool) -> str:
    """A panel's y label: an observable's name; the energy, as E(t) - E(0) when `shifted`, with its
    unit on a second line (a panel is short)."""
    if name != "energy":
        return name.removeprefix("obs/")
    return ("E(t) - E(0)" if shifted else "energy") + (f"\n[{unit}]" if unit else "")


def plot_trajectory(records: list[dict], exact: dict | None, path: Path, unit: str | None = None):
    """One panel per quantity (energy, then each `obs/<name>`): the measured values with error bars
    against t, and the exact dynamics as a line where known. A quantity constant in both curves
    (`constant`: zero or conserved by symmetry) gets no panel; the figure's title names those left
    out, with their value. A conserved energy (`conserved_energy`) is drawn as E(t) - E(0), E(0) in
    the panel's title; `unit` (summary.json's `energy_unit`) names the energy's unit.

    Returns:
        The matplotlib Figure (closed; written to `path`).
    """
    plt = _pyplot()
    every = quantities(records)
    names = [n for n in every if not constant(records, exact, n)] or every[:1]
    left_out = [n for n in every if n not in names]
    fig, axes = plt.subplots(len(names), 1, figsize=(6, 2.4 * len(names)), sharex=True, squeeze=False)
    for ax, name in zip(axes[:, 0], names):
        start = conserved_energy(records, exact) if name == "energy" else None
        shift = start or 0.0
        t_T, value, error = _series(records, name)
        ax.errorbar(t_T, value - shift, error, fmt="o", ms=3, label="TDVP")
        if exact is not None and name in exact:
            ax.plot(exact["t"], np.array(exact[name], float) - shift, "-", color="k", lw=1, label="exact")
            ax.legend(fontsize=8)
        if start is not None:
            ax.set_title(f"E(0) = {start:.10g}", fontsize=8, loc="right")
        ax.set_ylabel(_label(name, unit, start is not None))
        ax.ticklabel_format(axis="y", useOffset=False)
    axes[-1, 0].set_xlabel("t")
    if left_out:
        first = {n: _series(records, n)[1][0] for n in left_out}  # rounding noise around zero shown as 0
        values = ", ".join(f"{n.removeprefix('obs/')} = {0.0 if abs(v) < CONSTANT_TOLERANCE else v:.4g}"
                           for n, v in first.items())
        fig.suptitle(f"constant in t, not drawn: {values}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return fig


def plot_trajectories(runs: list[tuple[str, list[dict], dict | None]], path: Path, unit: str | None = None):
    """A sweep's time evolutions: one panel per quantity any run recorded, one curve per run
    (label, trajectory records, exact trajectory or None) with error bars, and each run's exact
    dynamics dashed in its colour where known. Where every run conserves its energy
    (`conserved_energy`), the energy panel shows each run's E(t) - E(0); `unit` names the energy's unit.

    Returns:
        The matplotlib Figure (closed; written to `path`), or None when no run has a trajectory.
    """
    runs = [run for run in runs if run[1]]
    if not runs:
        return None
    plt = _pyplot()
    names = []
    for _, records, _ in runs:
        names += [n for n in quantities(records) if n not in names]
    fig, axes = plt.subplots(len(names), 1, figsize=(6.5, 2.4 * len(names)), sharex=True, squeeze=False)
    starts = [conserved_energy(records, exact) for _, records, exact in runs]
    shifted = None not in starts
    for ax, name in zip(axes[:, 0], names):
        for (label, records, exact), start in zip(runs, starts):
            if name not in records[0]:
                continue
            shift = start if shifted and name == "energy" else 0.0
            t_T, value, error = _series(records, name)
            line = ax.errorbar(t_T, value - shift, error, fmt="o-", ms=2.5, lw=0.8, elinewidth=0.6, label=label)
            if exact is not None and name in exact:
                ax.plot(exact["t"], np.array(exact[name], float) - shift, "--", color=line.lines[0].get_color(),
                        lw=0.9)
        ax.set_ylabel(_label(name, unit, shifted))
        ax.ticklabel_format(axis="y", useOffset=False)
    axes[0, 0].legend(fontsize=7, title="dashed: exact" if any(e for _, _, e in runs) else None, title_fontsize=7)
    axes[-1, 0].set_xlabel("t")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return fig
