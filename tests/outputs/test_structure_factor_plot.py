"""runner.outputs.structure_factor_plot: S(q) as a heat map (2-D) or a line (chain), with the
exact S(q) beside it when correlations.json carries it."""

import numpy as np
import pytest

from runner import report
from runner.outputs import structure_factor_plot
from runner.physics import hilbert as hb
from tests.helpers.runs import completed, fake_run


def correlations(momenta, exact=True):
    """S(q) = 1 + |q|, errors 0.1, and the exact S(q) = 1 + |q| / 2 when `exact`."""
    q = np.asarray(momenta, float)
    norm = np.linalg.norm(q, axis=1)
    out = {"momenta": q.tolist(), "structure_factor": (1 + norm).tolist(), "structure_factor_error": [0.1] * len(q)}
    if exact:
        out["exact_structure_factor"] = (1 + norm / 2).tolist()
    return out


@pytest.mark.parametrize("lattice", [hb.square(L=4), hb.triangular(L=3), hb.kagome(Lx=2, Ly=3)])
def test_cells_give_every_pixel_its_nearest_momentum(lattice):
    q = np.asarray(lattice.momenta)
    index, (x0, x1, y0, y1) = structure_factor_plot.cells(q, pixels=120)
    counts = np.bincount(index[index >= 0], minlength=len(q))
    assert counts.min() > 0.6 * counts.max()  # every momentum gets a cell of about one size
    xs, ys = np.linspace(x0, x1, 120), np.linspace(y0, y1, 120)
    for i, (qx, qy) in enumerate(q):  # the pixel on a momentum is its own
        assert index[np.argmin(np.abs(ys - qy)), np.argmin(np.abs(xs - qx))] == i


def test_heat_maps_of_vmc_and_exact_on_one_scale(tmp_path):
    lattice = hb.square(L=4)
    fake_run(tmp_path / "0_a", ["a=1"], completed(-10.0), files={"correlations.json": correlations(lattice.momenta)})
    fake_run(tmp_path / "1_a", ["a=2"], completed(-10.0),
             files={"correlations.json": correlations(lattice.momenta, exact=False)})
    fake_run(tmp_path / "2_a", ["a=3"], completed(-10.0))  # no correlations.json
    runs = structure_factor_plot.chosen(sorted(report.collect(tmp_path), key=report._sort_key))
    assert [r["run"] for r in runs] == ["0_a", "1_a"]
    fig = structure_factor_plot.plot_structure_factor(runs, ["a=1", "a=2"], tmp_path / "sq.png")
    assert (tmp_path / "sq.png").stat().st_size > 0
    maps = [ax for ax in fig.axes if ax.images]
    assert len(maps) == 3  # VMC and exact for a=1, VMC alone for a=2
    vmc, exact = maps[0].images[0], maps[1].images[0]
    top = 1 + 1.5 * np.sqrt(2) * np.pi  # |q| largest at m = (3, 3) of 4
    assert vmc.get_clim() == exact.get_clim() == (1.0, pytest.approx(top))
    assert f"max {top:.4g} ± 0.1" in maps[0].get_title() and maps[1].get_title().startswith("exact")
    assert f"max {1 + (top - 1) / 2:.4g} at" in maps[1].get_title()
    # every momentum's S(q) is shown (each fills its cell), nothing else
    image = np.ma.getdata(vmc.get_array())
    shown = np.unique(image[np.isfinite(image)])
    np.testing.assert_allclose(shown, np.unique(1 + np.linalg.norm(lattice.momenta, axis=1)))


def test_a_chain_gets_lines_with_error_bars(tmp_path):
    lattice = hb.chain(L=6)
    fake_run(tmp_path / "0_a", ["a=1"], completed(-10.0), files={"correlations.json": correlations(lattice.momenta)})
    runs = structure_factor_plot.chosen(report.collect(tmp_path))
    fig = structure_factor_plot.plot_structure_factor(runs, ["a=1"], tmp_path / "sq.png")
    (ax,) = fig.axes
    assert len(ax.containers) == 1 and not ax.images
    q = np.sort(np.asarray(lattice.momenta)[:, 0])
    exact = [line for line in ax.lines if line.get_label() == "exact, a=1"]
    np.testing.assert_allclose(exact[0].get_xydata(), np.stack([q, 1 + np.abs(q) / 2], 1))


def test_chosen_spreads_over_the_sweep_or_takes_the_point(tmp_path):
    q = hb.chain(L=4).momenta
    for i in range(9):
        fake_run(tmp_path / f"{i}_a", [f"a={i}"], completed(-10.0), files={"correlations.json": correlations(q)})
    rows = sorted(report.collect(tmp_path), key=report._sort_key)
    picked = [r["run"] for r in structure_factor_plot.chosen(rows)]
    assert len(picked) == structure_factor_plot.MAX_RUNS and picked[0] == "0_a" and picked[-1] == "8_a"
    assert [r["run"] for r in structure_factor_plot.chosen(rows, "3_a")] == ["3_a"]
    assert report.main([str(tmp_path), "--point", "3_a"]) == 0
    assert (tmp_path / "structure_factor.png").is_file()
