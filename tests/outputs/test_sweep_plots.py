"""runner.outputs.sweep_plots: energy against the swept key with the exact lines, observables
beside their exact values, panels that are zero over the whole sweep left out; energies per site
across sizes, the unit on every energy axis."""

import numpy as np

from runner import report
from runner.outputs import sweep_plots
from tests.helpers.runs import completed, fake_run


def obs(mean, error):
    return {"mean": mean, "error": error}


def test_energy_with_error_bars_and_the_exact_lines(tmp_path):
    points = [(0.0, -10.0, -10.05, -10.05), (0.5, -8.0, -8.3, -8.1), (1.0, -7.0, None, None)]
    for i, (j2, energy, exact, sector_exact) in enumerate(points):
        summary = completed(energy, energy_error=0.01 * (i + 1), sector_exact_energy=sector_exact)
        summary.update(exact_energy=exact, relative_error=None)
        fake_run(tmp_path / f"{i}_j", [f"J2={j2}", "L=4"], summary)
    fake_run(tmp_path / "3_j", ["J2=2.0", "L=4"], {"status": "failed", "reason": "nan"})
    rows = sorted(report.collect(tmp_path), key=report._sort_key)
    fig = sweep_plots.plot_energy(rows, "J2", ["J2"], tmp_path / "e.png")
    (ax,) = fig.axes
    (bars,) = ax.containers
    np.testing.assert_allclose(bars.lines[0].get_xydata(), [[0.0, -10.0], [0.5, -8.0], [1.0, -7.0]])
    segments = bars.lines[2][0].get_segments()
    np.testing.assert_allclose([s[1, 1] - s[0, 1] for s in segments], [0.02, 0.04, 0.06])
    lines = {line.get_label(): line for line in ax.lines}
    np.testing.assert_allclose(lines["exact"].get_xydata(), [[0.0, -10.05], [0.5, -8.3]])
    np.testing.assert_allclose(lines["exact in sector"].get_xydata(), [[0.5, -8.1]])  # only where it differs
    assert lines["exact"].get_linestyle() == "--"


def test_zero_panels_are_left_out_and_exact_values_shown(tmp_path):
    for i, h in enumerate((0.5, 1.0, 1.5)):
        values = {"magnetization_z": obs(0.0, 0.0), "mz2": obs(0.0, 1e-13),  # zero by symmetry
                  "zz_nn": obs(-h, 0.01),
                  "magnetization_x": obs(0.0, 0.0 if i else 0.02)}  # zero mean, an error once: kept
        exact = {"zz_nn": -h - 0.1, "mz2": 0.0, "magnetization_z": 0.0}
        fake_run(tmp_path / f"{i}_h", [f"h={h}"], completed(-h, observables=values, exact_observables=exact))
    rows = sorted(report.collect(tmp_path), key=report._sort_key)
    fig = sweep_plots.plot_observables(rows, "h", ["h"], tmp_path / "o.png")
    panels = {ax.get_title(): ax for ax in fig.axes if ax.get_visible()}
    assert set(panels) == {"zz_nn", "magnetization_x"}
    zz = panels["zz_nn"]
    np.testing.assert_allclose(zz.lines[0].get_xydata(), [[0.5, -0.5], [1.0, -1.0], [1.5, -1.5]])
    (exact,) = [line for line in zz.lines if line.get_label() == "exact"]
    np.testing.assert_allclose(exact.get_xydata(), [[0.5, -0.6], [1.0, -1.1], [1.5, -1.6]])
    assert not [line for line in panels["magnetization_x"].lines if line.get_label() == "exact"]


def test_is_zero_needs_every_mean_error_and_exact_value_near_zero():
    assert sweep_plots.is_zero([(0.0, 0.0, None), (1e-14, 0.0, 0.0)])
    assert not sweep_plots.is_zero([(0.0, 0.0, None), (0.0, 0.0, 0.25)])  # the exact value is not zero
    assert not sweep_plots.is_zero([(0.0, 1e-3, None)])
    assert not sweep_plots.is_zero([(-1e-3, 0.0, None)])


def test_observables_all_zero_give_no_plot(tmp_path):
    for i, h in enumerate((0.5, 1.0)):
        fake_run(tmp_path / f"{i}_h", [f"h={h}"], completed(-h, observables={"mz2": obs(0.0, 0.0)}))
    assert sweep_plots.plot_observables(report.collect(tmp_path), "h", ["h"], tmp_path / "o.png") is None


PAULI = "Pauli (sigma = 2S)"


def sized_runs(root, sizes, key="L", unit=PAULI):
    """Completed runs over `key` of `sizes` sites each (E = -1.5 N, exact -1.6 N, E at the steps -N, -1.5 N)."""
    for i, (x, n) in enumerate(sizes):
        summary = completed(-1.5 * n, exact=-1.6 * n, n_sites=n, energy_unit=unit, energy_error=0.01 * n)
        fake_run(root / f"{i}_{key}={x}", [f"{key}={x}"], summary, energies=[-1.0 * n, -1.5 * n])
    return sorted(report.collect(root), key=report._sort_key)


def test_runs_of_several_sizes_are_compared_per_site_in_the_unit(tmp_path):
    rows = sized_runs(tmp_path, [(4, 4), (6, 6), (8, 8)])
    label = f"energy per site [{PAULI}]"
    (ax,) = sweep_plots.plot_energy(rows, "L", ["L"], tmp_path / "e.png").axes
    assert ax.get_ylabel() == label and not ax.child_axes
    (bars,) = ax.containers
    np.testing.assert_allclose(bars.lines[0].get_xydata(), [[4, -1.5], [6, -1.5], [8, -1.5]])
    np.testing.assert_allclose([s[1, 1] - s[0, 1] for s in bars.lines[2][0].get_segments()], [0.02] * 3)
    (exact,) = [line for line in ax.lines if line.get_label() == "exact"]
    np.testing.assert_allclose(exact.get_ydata(), [-1.6] * 3)
    energy_ax, _ = sweep_plots.plot_convergence(rows, ["L"], tmp_path / "c.png").axes
    assert energy_ax.get_ylabel() == label
    np.testing.assert_allclose(energy_ax.lines[0].get_ydata(), [-1.0, -1.5])
    for row in rows:
        row["relative_error"] = None  # plot_sweep draws the energy
    (ax,) = sweep_plots.plot_sweep(rows, "L", tmp_path / "s.png").axes
    assert ax.get_ylabel() == label
    np.testing.assert_allclose(ax.containers[0].lines[0].get_xydata()[:, 1], [-1.5] * 3)


def test_runs_of_one_size_draw_totals_with_a_per_site_axis(tmp_path):
    unit = "Pauli (sigma.sigma = 4 S.S)"
    rows = sized_runs(tmp_path, [(0.0, 4), (0.5, 4)], key="J2", unit=unit)
    (ax,) = sweep_plots.plot_energy(rows, "J2", ["J2"], tmp_path / "e.png").axes
    assert ax.get_ylabel() == f"energy [{unit}]"
    (right,) = ax.child_axes
    assert right.get_ylabel() == "energy per site (N = 4)"
    np.testing.assert_allclose(ax.containers[0].lines[0].get_xydata()[:, 1], [-6.0, -6.0])
    energy_ax, _ = sweep_plots.plot_convergence(rows, ["J2"], tmp_path / "c.png").axes
    assert energy_ax.get_ylabel() == f"energy [{unit}]" and len(energy_ax.child_axes) == 1


def test_runs_without_their_size_or_unit_draw_totals_labelled_energy(tmp_path):
    for i, h in enumerate((0.5, 1.0)):
        unknown = {**completed(-h), "exact_energy": None, "relative_error": None}  # no n_sites, no energy_unit
        fake_run(tmp_path / f"{i}_h={h}", [f"h={h}"], unknown, energies=[-h])
    rows = sorted(report.collect(tmp_path), key=report._sort_key)
    for fig in (sweep_plots.plot_energy(rows, "h", ["h"], tmp_path / "e.png"),
                sweep_plots.plot_sweep(rows, "h", tmp_path / "s.png"),
                sweep_plots.plot_convergence(rows, ["h"], tmp_path / "c.png")):
        assert fig.axes[0].get_ylabel() == "energy" and not fig.axes[0].child_axes


def test_the_unit_of_runs_in_different_units_names_both():
    rows = [{"summary": {"energy_unit": "b"}}, {"summary": {"energy_unit": "a"}}, {"summary": {}}]
    assert sweep_plots.energy_unit(rows) == "a / b"
    assert sweep_plots.energy_unit(rows[1:]) == "a" and sweep_plots.energy_unit(rows[2:]) is None
