"""S(q) on every momentum of the lattice (correlations.json): a heat map over the momentum plane
for 2-D lattices, a line for chains, with the exact S(q) beside it where known."""

from pathlib import Path

import numpy as np

from runner.outputs.sweep_plots import pyplot

MAX_RUNS = 6  # heat maps drawn at most (evenly spaced over the sweep) unless a run is chosen
PIXELS = 160  # per side of a heat map


def structure_factors(row: dict):
    """(momenta [Q, d], S(q) [Q], error [Q], exact S(q) [Q] or None) of a run's correlations.json,
    or None without one (or without S(q))."""
    corr = row.get("correlations") or {}
    if not corr.get("momenta") or not corr.get("structure_factor"):
        return None
    as_array = lambda v: np.array([np.nan if x is None else x for x in v], float)
    momenta = np.asarray(corr["momenta"], float).reshape(len(corr["momenta"]), -1)
    error = corr.get("structure_factor_error") or [0.0] * len(momenta)
    exact = corr.get("exact_structure_factor")
    return (momenta, as_array(corr["structure_factor"]), as_array(error),
            None if exact is None else as_array(exact))


def cells(momenta_QxD: np.ndarray, pixels: int = PIXELS):
    """The heat map's image: every pixel of the momenta's bounding box (padded by half a spacing)
    takes the index of its nearest momentum (its Voronoi cell), -1 farther than 0.75 of the
    smallest spacing from every momentum (outside the momenta's parallelogram).

    Returns:
        (index [pixels, pixels] int, extent (x0, x1, y0, y1)).
    """
    q = momenta_QxD[:, :2]
    gaps = np.linalg.norm(q[:, None] - q[None], axis=-1)
    spacing = np.min(gaps[gaps > 1e-12]) if len(q) > 1 else 1.0
    low, high = q.min(0) - spacing / 2, q.max(0) + spacing / 2
    xs, ys = np.linspace(low[0], high[0], pixels), np.linspace(low[1], high[1], pixels)
    grid = np.stack(np.meshgrid(xs, ys), -1).reshape(-1, 2)
    distance = np.linalg.norm(grid[:, None] - q[None], axis=-1)
    index = np.argmin(distance, axis=1)
    index[distance[np.arange(len(grid)), index] > 0.75 * spacing] = -1
    return index.reshape(pixels, pixels), (low[0], high[0], low[1], high[1])


def _heat_map(ax, momenta, values, vmin, vmax, title):
    index, extent = cells(momenta)
    image = np.where(index >= 0, values[np.maximum(index, 0)], np.nan)
    shown = ax.imshow(image, origin="lower", extent=extent, vmin=vmin, vmax=vmax, cmap="viridis",
                      interpolation="nearest")
    ax.plot(momenta[:, 0], momenta[:, 1], "k.", ms=2)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("q_x")
    ax.set_ylabel("q_y")
    ax.set_aspect("equal")
    return shown


def _title(name, momenta, values, errors=None):
    top = int(np.nanargmax(values))
    q = ", ".join(f"{x:.2f}" for x in momenta[top])
    error = "" if errors is None else f" ± {errors[top]:.2g}"
    return f"{name}\nmax {values[top]:.4g}{error} at q=({q})"


def chosen(rows: list[dict], point: str | None = None) -> list[dict]:
    """The completed runs whose S(q) is drawn: the run named `point` (its `run` column), else at
    most MAX_RUNS evenly spaced over `rows` (the first and the last included)."""
    runs = [r for r in rows if r["status"] == "completed" and structure_factors(r) is not None]
    if point is not None:
        return [r for r in runs if r["run"] == point]
    if len(runs) <= MAX_RUNS:
        return runs
    return [runs[i] for i in np.unique(np.linspace(0, len(runs) - 1, MAX_RUNS).round().astype(int))]


def plot_structure_factor(runs: list[dict], labels: list[str], path: Path):
    """S(q) of each run in `runs` (see `chosen`): a chain's as one line per run with error bars
    (the exact S(q) dashed); a 2-D lattice's as one row of heat maps per run, VMC and, when
    correlations.json holds `exact_structure_factor`, exact on one colour scale.

    Returns:
        The matplotlib Figure (closed; written to `path`), or None when no run has S(q).
    """
    plt = pyplot()
    found = [(label, structure_factors(r)) for r, label in zip(runs, labels)]
    found = [(label, f) for label, f in found if f is not None]
    if not found:
        return None
    if found[0][1][0].shape[1] == 1:
        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        for label, (momenta, values, errors, exact) in found:
            order = np.argsort(momenta[:, 0])
            bars = ax.errorbar(momenta[order, 0], values[order], yerr=errors[order], fmt="o-", ms=4, capsize=3,
                               label=label)
            if exact is not None:
                ax.plot(momenta[order, 0], exact[order], "x--", color=bars.lines[0].get_color(), label=f"exact, {label}")
        _label_largest(ax, found)
        ax.set_xlabel("q")
        ax.set_ylabel("S(q)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    else:
        fig = _heat_maps(plt, found)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return fig


def largest(found) -> tuple[str, float, float]:
    """(label, q, S(q)) of the curve that reaches the largest S(q) among a chain's runs."""
    label, (momenta, values, _, _) = max(found, key=lambda f: np.nanmax(f[1][1]))
    top = int(np.nanargmax(values))
    return label, float(momenta[top, 0]), float(values[top])


def _label_largest(ax, found):
    """Marks the largest S(q) of a chain's curves with its q (and, for several runs, the run)."""
    label, q, value = largest(found)
    who = f"{label}: " if len(found) > 1 else ""
    left = q <= np.mean(ax.get_xlim())  # the text runs into the plot, away from its edge
    ax.annotate(f"{who}max S(q) = {value:.4g} at q = {q / np.pi:.3g}π ({q:.4f})", (q, value),
                xytext=(8 if left else -8, 6), textcoords="offset points", ha="left" if left else "right",
                fontsize=8)
    ax.set_ylim(top=max(ax.get_ylim()[1], value * 1.12))


def _heat_maps(plt, found):
    cols = 2 if any(f[3] is not None for _, f in found) else 1
    fig, axes = plt.subplots(len(found), cols, figsize=(4.6 * cols, 3.9 * len(found)), squeeze=False)
    for (label, (momenta, values, errors, exact)), ax_row in zip(found, axes):
        both = np.concatenate([values, exact]) if exact is not None else values
        vmin, vmax = np.nanmin(both), np.nanmax(both)
        shown = _heat_map(ax_row[0], momenta, values, vmin, vmax, _title(f"S(q), {label}", momenta, values, errors))
        if exact is not None:
            _heat_map(ax_row[1], momenta, exact, vmin, vmax, _title("exact", momenta, exact))
        elif cols == 2:
            ax_row[1].set_visible(False)
        fig.colorbar(shown, ax=ax_row[1] if exact is not None else ax_row[0], shrink=0.8)
    return fig
