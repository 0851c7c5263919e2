"""The plot of a time evolution: energy and every observable against t, with the exact curves."""

from pathlib import Path

import numpy as np


def plot_trajectory(records: list[dict], exact: dict | None, path: Path):
    """One panel per quantity (energy, then each `obs/<name>`): the measured values with error bars
    against t, and the exact dynamics as a line where known.

    Returns:
        The matplotlib Figure (closed; written to `path`).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["energy"] + [k for k in (records[0] if records else {}) if k.startswith("obs/") and not k.endswith("_error")]
    fig, axes = plt.subplots(len(names), 1, figsize=(6, 2.4 * len(names)), sharex=True, squeeze=False)
    t_T = np.array([r["t"] for r in records], float)
    for ax, name in zip(axes[:, 0], names):
        value = np.array([np.nan if r.get(name) is None else r[name] for r in records], float)
        error = np.array([r.get(f"{name}_error") or 0.0 for r in records], float)
        ax.errorbar(t_T, value, yerr=error, fmt="o", ms=3, label="TDVP")
        if exact is not None and name in exact:
            ax.plot(exact["t"], exact[name], "-", color="k", lw=1, label="exact")
            ax.legend(fontsize=8)
        ax.set_ylabel(name.removeprefix("obs/"))
    axes[-1, 0].set_xlabel("t")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return fig
