"""Convergence plots (matplotlib, no display)."""

from pathlib import Path


def plot_energy(records: list[dict], exact_energy: float | None, path: Path) -> None:
    """Energy against step with a +-error band, and the exact energy when known."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = [r for r in records if r.get("energy") is not None]
    fig, ax = plt.subplots(figsize=(6, 4))
    if rows:
        step = np.array([r["step"] for r in rows])
        energy = np.array([r["energy"] for r in rows])
        error = np.array([r["energy_error"] or 0.0 for r in rows])
        ax.plot(step, energy, lw=1, label="VMC energy")
        ax.fill_between(step, energy - error, energy + error, alpha=0.3, lw=0)
    if exact_energy is not None:
        ax.axhline(exact_energy, color="k", ls="--", lw=1, label=f"exact {exact_energy:.6f}")
    ax.set_xlabel("step")
    ax.set_ylabel("energy")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
