"""Convergence plots (matplotlib, no display)."""

from pathlib import Path

import numpy as np


def deviation(records: list[dict], exact_energy: float | None):
    """The log-scale panel's series: |E - E_exact| with the energy's error bars when the exact
    energy is known, else the variance (no error bars: it has none).

    Returns:
        (step [T], value [T], error [T] or None, label); steps without a finite value are dropped.
    """
    if exact_energy is not None:
        rows = [r for r in records if r.get("energy") is not None]
        step = np.array([r["step"] for r in rows], dtype=int)
        value = np.abs(np.array([r["energy"] for r in rows], dtype=float) - exact_energy)
        error = np.array([r.get("energy_error") or 0.0 for r in rows], dtype=float)
        return step, value, error, "|E - E_exact|"
    rows = [r for r in records if r.get("variance") is not None]
    step = np.array([r["step"] for r in rows], dtype=int)
    return step, np.array([r["variance"] for r in rows], dtype=float), None, "variance"


def log_error_bars(value, error):
    """Asymmetric bars [2, T] for a log axis: the lower bar stops at a tenth of the value
    (a bar reaching zero or below has no place on a log scale)."""
    lower = np.minimum(error, 0.9 * value)
    return np.stack([lower, error])


def energy_label(unit: str | None) -> str:
    """The energy axis's label: `energy` and its unit, where known."""
    return "energy" if not unit else f"energy [{unit}]"


def plot_energy(records: list[dict], exact_energy: float | None, path: Path, n_sites: int | None = None,
                unit: str | None = None):
    """Energy against step with a +-error band and the exact energy when known (top), and on a
    log scale |E - E_exact| with error bars, or the variance without an exact energy (bottom):
    the top panel flattens once the energy is close; the bottom one keeps showing progress.
    With `n_sites`, the top panel has a second axis on the right with the energy per site (and the
    exact line's label both); `unit` (summary.json's `energy_unit`) names the energies' unit.

    Returns:
        The matplotlib Figure (closed; written to `path`).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in records if r.get("energy") is not None]
    fig, (ax, ax_log) = plt.subplots(2, 1, figsize=(6, 6.5), sharex=True)
    if rows:
        step = np.array([r["step"] for r in rows])
        energy = np.array([r["energy"] for r in rows])
        error = np.array([r["energy_error"] or 0.0 for r in rows])
        ax.plot(step, energy, lw=1, label="VMC energy")
        ax.fill_between(step, energy - error, energy + error, alpha=0.3, lw=0)
    if exact_energy is not None:
        per = f" ({exact_energy / n_sites:.6f} per site)" if n_sites else ""
        ax.axhline(exact_energy, color="k", ls="--", lw=1, label=f"exact {exact_energy:.6f}{per}")
    ax.set_ylabel(energy_label(unit))
    if n_sites:
        right = ax.secondary_yaxis("right", functions=(lambda e: e / n_sites, lambda e: e * n_sites))
        right.set_ylabel(f"energy per site (N = {n_sites})")
    if rows or exact_energy is not None:
        ax.legend()

    step, value, error, label = deviation(records, exact_energy)
    positive = value > 0  # log scale: an exact zero has no place on it
    if positive.any():
        step, value = step[positive], value[positive]
        if error is not None:
            ax_log.errorbar(step, value, yerr=log_error_bars(value, error[positive]), lw=1,
                            elinewidth=0.5, alpha=0.9, label=label)
        else:
            ax_log.plot(step, value, lw=1, label=label)
        ax_log.legend()
    ax_log.set_yscale("log")
    ax_log.set_ylabel(label)
    ax_log.set_xlabel("step")
    ax_log.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return fig
