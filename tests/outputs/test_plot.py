"""runner.outputs.plot: energy.png has a log-scale panel (|E - E_exact| with error bars, or the variance)."""

import numpy as np
import pytest

from runner.outputs import plot

EXACT = -10.0


def converging(n=40):
    return [{"step": i, "energy": EXACT + 2.0 * 0.8**i, "energy_error": 0.01 * 0.9**i,
             "variance": 4.0 * 0.8**i} for i in range(n)]


def test_deviation_from_exact_with_error_bars():
    records = converging()
    records.insert(3, {"step": 99, "energy": None, "energy_error": None, "variance": None})  # a failed step
    step, value, error, label = plot.deviation(records, EXACT)
    assert label == "|E - E_exact|" and 99 not in step
    np.testing.assert_allclose(value, [2.0 * 0.8**i for i in range(40)])
    np.testing.assert_allclose(error, [0.01 * 0.9**i for i in range(40)])


def test_deviation_without_exact_is_the_variance():
    step, value, error, label = plot.deviation(converging(), None)
    assert label == "variance" and error is None
    np.testing.assert_allclose(value, [4.0 * 0.8**i for i in range(40)])


def test_log_error_bars_stay_positive():
    bars = plot.log_error_bars(np.array([1.0, 0.1]), np.array([0.5, 0.3]))
    np.testing.assert_allclose(bars, [[0.5, 0.09], [0.5, 0.3]])


@pytest.mark.parametrize("exact", [EXACT, None])
def test_energy_png_has_a_log_panel(tmp_path, exact):
    fig = plot.plot_energy(converging(), exact, tmp_path / "energy.png")
    assert (tmp_path / "energy.png").stat().st_size > 1000
    top, bottom = fig.axes
    assert top.get_yscale() == "linear" and bottom.get_yscale() == "log"
    assert bottom.get_ylabel() == ("|E - E_exact|" if exact is not None else "variance")
    has_bars = bool(bottom.containers)  # errorbar() leaves an ErrorbarContainer
    assert has_bars == (exact is not None)
    (line,) = bottom.get_lines()[:1]
    assert line.get_ydata()[-1] == pytest.approx(2.0 * 0.8**39 if exact is not None else 4.0 * 0.8**39)


def test_no_records_still_writes_a_plot(tmp_path):
    plot.plot_energy([], None, tmp_path / "energy.png")
    assert (tmp_path / "energy.png").stat().st_size > 0
