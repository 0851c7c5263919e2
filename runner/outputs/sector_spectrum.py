"""A sweep over symmetry sectors (`model.sector`, `hilbert.total_sz`): the levels by momentum,
irrep, parity and S^z beside the exact ones of spectrum.json, and each run's gap above the lowest."""

import csv
import math
import re
from pathlib import Path

from runner.outputs.sweep_plots import pyplot

SECTOR_KEYS = ("model.sector", "hilbert.total_sz")  # swept keys that choose a sector
NAME = re.compile(r"^k=\(([^)]*)\) (\S+)(?: P=([+-]\d+))?$")  # runner.physics.symmetry.Sector.name
MARKERS = "os^Dv<>PX*ph"
GAP_COLUMNS = ("run", "sector", "total_sz", "energy", "energy_error", "gap", "gap_error", "exact_level", "exact_gap")


def parse(name: str | None):
    """(momentum tuple, irrep, parity or None) of a sector's name (`k=(0,1) A1 P=+1`), or None."""
    found = NAME.match(name or "")
    if found is None:
        return None
    momentum = tuple(int(m) for m in found[1].split(",") if m.strip())
    return momentum, found[2], None if found[3] is None else int(found[3])


def is_sector_key(key: str) -> bool:
    """Whether a swept key chooses a sector (`SECTOR_KEYS`, or a field of `model.sector`)."""
    return key in SECTOR_KEYS or key.startswith("model.sector.")


def groups(rows: list[dict], keys: list[str]) -> dict[str, list[dict]]:
    """The completed runs with an energy by the values of the swept keys that choose no sector,
    when some swept key chooses one: {label: runs}, only groups whose runs differ in sector or
    total_sz; empty for any other sweep."""
    if not any(is_sector_key(k) for k in keys):
        return {}
    others = [k for k in keys if not is_sector_key(k)]
    out = {}
    for row in rows:
        if row["status"] == "completed" and row.get("energy") is not None:
            label = ", ".join(f"{k}={row['overrides'].get(k, '-')}" for k in others)
            out.setdefault(label, []).append(row)
    return {label: runs for label, runs in out.items()
            if len({(r.get("sector"), r.get("total_sz")) for r in runs}) > 1}


def exact_level(row: dict):
    """The lowest exact level the run's sector can reach: the summary's `sector_exact_energy`, else
    the sector's lowest level in spectrum.json, else (no sector) the exact ground energy; or None."""
    if row.get("sector_exact_energy") is not None:
        return row["sector_exact_energy"]
    levels = (row.get("spectrum") or {}).get("levels") or {}
    if row.get("sector") in levels and levels[row["sector"]]:
        return levels[row["sector"]][0]
    return row.get("exact_energy") if row.get("sector") is None else None


def gaps(runs: list[dict]) -> list[dict]:
    """Each run's energy above the lowest run's, in ascending order of energy.

    gap_error is sqrt(err_i^2 + err_0^2) (two runs, independent samples), 0 for the lowest run
    itself; exact_gap is the difference of the two runs' `exact_level`s where both are known.
    """
    ordered = sorted(runs, key=lambda r: r["energy"])
    low = ordered[0]
    out = []
    for row in ordered:
        error, error_low = row.get("energy_error") or 0.0, low.get("energy_error") or 0.0
        exact, exact_low = exact_level(row), exact_level(low)
        out.append({
            "run": row["run"], "sector": row.get("sector"), "total_sz": row.get("total_sz"),
            "energy": row["energy"], "energy_error": row.get("energy_error"),
            "gap": row["energy"] - low["energy"],
            "gap_error": 0.0 if row is low else math.sqrt(error**2 + error_low**2),
            "exact_level": exact,
            "exact_gap": None if exact is None or exact_low is None else exact - exact_low,
        })
    return out


def _short(run: str) -> str:
    """A sweep job's number (Hydra's subdirectories start with it), else the run's path."""
    head = run.split("/")[-1].split("_")[0]
    return head if head.isdigit() else run


def format_gaps(label: str, table: list[dict]) -> str:
    """The gaps as text: a title naming the lowest run, then one line per run (by its job number)."""
    show = lambda v, f: "-" if v is None else format(v, f)
    low = table[0]
    lines = [f"gaps above the lowest run ({_short(low['run'])}: {low['sector'] or 'no sector'}, "
             f"total_sz {show(low['total_sz'], 'g')})" + (f", {label}" if label else "") + ":"]
    cells = [["run", "sector", "total_sz", "energy", "gap", "exact gap"]]
    for g in table:
        cells.append([_short(g["run"]), g["sector"] or "-", show(g["total_sz"], "g"),
                      f"{g['energy']:.8f} ± {show(g['energy_error'], '.1e')}",
                      f"{g['gap']:.6f} ± {g['gap_error']:.1e}", show(g["exact_gap"], ".6f")])
    widths = [max(len(str(c)) for c in col) for col in zip(*cells)]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(cs, widths)).rstrip() for cs in cells]
    return "\n".join(lines)


def write_gaps(tables: dict[str, list[dict]], path: Path) -> None:
    """Every group's gaps in one CSV (`group` first, full precision, empty cells where unknown)."""
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["group", *GAP_COLUMNS])
        for label, table in tables.items():
            for g in table:
                writer.writerow([label, *("" if g[c] is None else g[c] for c in GAP_COLUMNS)])


def _places(runs: list[dict]):
    """x positions: {momentum or None: column} and {(irrep, parity): offset within a column},
    over the runs' sectors and every level of their spectrum.json."""
    sectors = [parse(r.get("sector")) for r in runs]
    for row in runs:
        sectors += [parse(name) for name in ((row.get("spectrum") or {}).get("levels") or {})]
    momenta = sorted({s[0] for s in sectors if s is not None}) + ([None] if None in sectors else [])
    kinds = sorted({s[1:] for s in sectors if s is not None}, key=lambda k: (k[0], k[1] or 0))
    width = 0.7 / max(len(kinds), 1)
    return ({m: i for i, m in enumerate(momenta)},
            {k: (j - (len(kinds) - 1) / 2) * width for j, k in enumerate(kinds)})


def _kind_label(kind) -> str:
    irrep, parity = kind
    return irrep if parity is None else f"{irrep} P={parity:+d}"


def _momentum_label(momentum) -> str:
    return "no sector" if momentum is None else f"k=({','.join(str(m) for m in momentum)})"


def _draw_exact(ax, spectrum: dict, columns, offsets) -> None:
    """Every level of spectrum.json as a grey bar at its sector's place."""
    for name, levels in (spectrum.get("levels") or {}).items():
        sector = parse(name)
        if sector is not None and levels:
            x = columns[sector[0]] + offsets[sector[1:]]
            ax.plot([x] * len(levels), levels, "_", color="0.45", ms=16, mew=1.5, gid="exact")


def _draw_runs(ax, runs: list[dict], columns, offsets, color) -> None:
    """Each run's energy with its error bar: marker by irrep, open for parity -1."""
    kinds = list(offsets)
    for row in runs:
        sector = parse(row.get("sector"))
        if sector is None:
            x, marker, hollow = columns[None], "o", False
        else:
            x = columns[sector[0]] + offsets[sector[1:]]
            marker, hollow = MARKERS[kinds.index(sector[1:]) % len(MARKERS)], sector[2] == -1
        ax.errorbar(x, row["energy"], yerr=row.get("energy_error") or 0.0, fmt=marker, color=color,
                    mfc="none" if hollow else color, ms=7, capsize=3)


def plot_spectrum(runs: list[dict], path: Path):
    """The runs' energies (with error bars) against momentum, one panel per total_sz, marker by
    irrep and open for parity -1, beside the exact levels of the runs' spectrum.json (grey bars).

    Returns:
        The matplotlib Figure (closed; written to `path`), or None without runs.
    """
    if not runs:
        return None
    plt = pyplot()
    columns, offsets = _places(runs)
    by_sz = {}
    for row in runs:
        by_sz.setdefault(row.get("total_sz"), []).append(row)
    panels = sorted(by_sz, key=lambda sz: (sz is None, sz or 0))
    width = max(4.0, 0.8 * len(columns) + 1.5)
    fig, axes = plt.subplots(1, len(panels), figsize=(width * len(panels), 4.6), sharey=True, squeeze=False)
    for i, (ax, sz) in enumerate(zip(axes[0], panels)):
        spectrum = next((r["spectrum"] for r in by_sz[sz] if r.get("spectrum")), None)
        if spectrum is not None:
            _draw_exact(ax, spectrum, columns, offsets)
        _draw_runs(ax, by_sz[sz], columns, offsets, f"C{i}")
        ax.set_xticks(range(len(columns)), [_momentum_label(m) for m in columns],
                      rotation=45 if len(columns) > 4 else 0, fontsize=8)
        ax.set_xlim(-0.6, len(columns) - 0.4)
        ax.set_title("total_sz not fixed" if sz is None else f"total_sz = {sz:g}", fontsize=10)
        ax.grid(alpha=0.3, axis="y")
    axes[0, 0].set_ylabel("energy")
    kinds = list(offsets)
    for kind in sorted({parse(r.get("sector"))[1:] for r in runs if parse(r.get("sector"))}, key=kinds.index):
        marker = MARKERS[kinds.index(kind) % len(MARKERS)]  # a legend entry without data, per drawn kind
        axes[0, -1].plot([], [], marker, color="0.2", mfc="none" if kind[1] == -1 else "0.2", label=_kind_label(kind))
    if any(r.get("spectrum") for r in runs):
        axes[0, -1].plot([], [], "_", color="0.45", ms=16, mew=1.5, label="exact levels")
    if axes[0, -1].get_legend_handles_labels()[1]:
        axes[0, -1].legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return fig
