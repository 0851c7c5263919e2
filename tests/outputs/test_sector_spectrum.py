"""runner.outputs.sector_spectrum: a sweep over sectors, its gaps (against hand computation) and
its spectrum plot (which runs and exact levels appear where)."""

import csv
import math

import numpy as np
import pytest

from runner import report
from runner.outputs import sector_spectrum
from tests.helpers.runs import completed, fake_run

# The exact levels of one S^z sector as spectrum.json holds them (runner.physics.spectrum.to_json).
SPECTRUM_SZ0 = {"levels": {"k=(0) A' P=+1": [-10.1, -9.0], "k=(0) A' P=-1": [-9.8], "k=(1) A P=+1": [-9.6],
                           "k=(1) A P=-1": []},
                "ground_sector": "k=(0) A' P=+1", "ground_energy": -10.1}
SPECTRUM_SZ1 = {"levels": {"k=(0) A'": [-9.3], "k=(1) A": [-9.1]}, "ground_sector": "k=(0) A'", "ground_energy": -9.3}


@pytest.fixture
def sector_sweep(tmp_path):
    """Four runs over model.sector and hilbert.total_sz: energies and errors chosen for hand sums."""
    points = [  # (sector, total_sz, energy, error, sector_exact_energy in the summary)
        ("k=(0) A' P=+1", 0, -10.0, 0.05, -10.1),
        ("k=(0) A' P=-1", 0, -9.7, 0.12, -9.8),
        ("k=(0) A'", 1, -9.2, 0.0, None),  # its exact level only in spectrum.json
        ("k=(1) A P=+1", 0, -9.5, 0.04, None),
    ]
    for i, (sector, sz, energy, error, exact) in enumerate(points):
        summary = completed(energy, exact=-10.1, sector=sector, energy_error=error)
        if exact is not None:
            summary["sector_exact_energy"] = exact
        if i == 3:
            summary["exact_energy"] = None  # no exact solver: no exact level
        fake_run(tmp_path / f"{i}_x", [f"model.sector='{sector}'", f"hilbert.total_sz={sz}"], summary,
                 total_sz=sz, files={} if i == 3 else {"spectrum.json": SPECTRUM_SZ1 if sz else SPECTRUM_SZ0})
    return tmp_path


def test_parse_reads_the_names_of_sectors():
    assert sector_spectrum.parse("k=(0,1) A1 P=+1") == ((0, 1), "A1", 1)
    assert sector_spectrum.parse("k=(2) A'' P=-1") == ((2,), "A''", -1)
    assert sector_spectrum.parse("k=(0,0) B2") == ((0, 0), "B2", None)
    assert sector_spectrum.parse(None) is None and sector_spectrum.parse("auto") is None


def test_gaps_against_hand_computation(sector_sweep):
    rows = sorted(report.collect(sector_sweep), key=report._sort_key)
    (runs,) = sector_spectrum.groups(rows, report.swept_keys(rows)).values()
    table = sector_spectrum.gaps(runs)
    assert [g["run"] for g in table] == ["0_x", "1_x", "3_x", "2_x"]  # ascending energy
    assert [g["total_sz"] for g in table] == [0, 0, 0, 1]
    expected = [(0.0, 0.0, 0.0), (0.3, math.sqrt(0.05**2 + 0.12**2), 0.3), (0.5, math.sqrt(0.05**2 + 0.04**2), None),
                (0.8, 0.05, 10.1 - 9.3)]
    for g, (gap, error, exact) in zip(table, expected):
        assert g["gap"] == pytest.approx(gap, abs=1e-12)
        assert g["gap_error"] == pytest.approx(error, abs=1e-15)
        assert g["exact_gap"] == (None if exact is None else pytest.approx(exact, abs=1e-12))
    assert [g["exact_level"] for g in table] == [-10.1, -9.8, None, -9.3]  # summary, summary, none, spectrum.json


def test_groups_only_for_a_sweep_over_sectors(sector_sweep, tmp_path_factory):
    rows = report.collect(sector_sweep)
    assert sector_spectrum.groups(rows, ["model.sector", "hilbert.total_sz"])
    assert sector_spectrum.groups(rows, ["model.alpha"]) == {}
    other = tmp_path_factory.mktemp("alpha")
    for i, alpha in enumerate((1, 2)):
        fake_run(other / f"{i}_a", [f"model.alpha={alpha}"], completed(-10.0 + 0.1 * i))
    rows = report.collect(other)
    assert sector_spectrum.groups(rows, report.swept_keys(rows)) == {}


def test_groups_by_the_other_swept_keys(tmp_path):
    for i, (j2, sz) in enumerate([(0.0, 0), (0.0, 1), (0.5, 0), (0.5, 1)]):
        fake_run(tmp_path / f"{i}_p", [f"hamiltonian.J2={j2}", f"hilbert.total_sz={sz}"],
                 completed(-10.0 + sz + j2, energy_error=0.01), total_sz=sz)
    rows = sorted(report.collect(tmp_path), key=report._sort_key)
    found = sector_spectrum.groups(rows, report.swept_keys(rows))
    assert list(found) == ["hamiltonian.J2=0.0", "hamiltonian.J2=0.5"]
    for runs in found.values():
        gap = sector_spectrum.gaps(runs)[1]
        assert gap["gap"] == pytest.approx(1.0) and gap["gap_error"] == pytest.approx(math.sqrt(2) * 0.01)


def test_spectrum_plot_draws_every_run_and_every_exact_level(sector_sweep):
    rows = sorted(report.collect(sector_sweep), key=report._sort_key)
    (runs,) = sector_spectrum.groups(rows, report.swept_keys(rows)).values()
    fig = sector_spectrum.plot_spectrum(runs, sector_sweep / "s.png")
    assert (sector_sweep / "s.png").stat().st_size > 0
    sz0, sz1 = fig.axes
    assert (sz0.get_title(), sz1.get_title()) == ("total_sz = 0", "total_sz = 1")
    assert [t.get_text() for t in sz0.get_xticklabels()] == ["k=(0)", "k=(1)"]
    assert len(sz0.containers) == 3 and len(sz1.containers) == 1  # one error bar per run
    energies = sorted(c.lines[0].get_ydata()[0] for c in sz0.containers)
    assert energies == [-10.0, -9.7, -9.5]
    bars = lambda ax: sorted(y for line in ax.lines if line.get_gid() == "exact" for y in line.get_ydata())
    assert bars(sz0) == [-10.1, -9.8, -9.6, -9.0] and bars(sz1) == [-9.3, -9.1]
    # the run and the exact level of one sector share their place
    (x_run,) = [c.lines[0].get_xdata()[0] for c in sz0.containers if c.lines[0].get_ydata()[0] == -9.7]
    (x_exact,) = [line.get_xdata()[0] for line in sz0.lines if line.get_gid() == "exact" and -9.8 in line.get_ydata()]
    assert x_run == x_exact
    hollow = [c.lines[0].get_markerfacecolor() for c in sz0.containers if c.lines[0].get_ydata()[0] == -9.7]
    assert hollow == ["none"]  # parity -1


def test_report_prints_and_writes_the_gaps(sector_sweep, capsys):
    report.report(sector_sweep)
    out = capsys.readouterr().out
    assert "gaps above the lowest run (0: k=(0) A' P=+1, total_sz 0):" in out
    assert "0.300000 ± 1.3e-01" in out
    with (sector_sweep / "gaps.csv").open() as f:
        table = list(csv.DictReader(f))
    assert [r["run"] for r in table] == ["0_x", "1_x", "3_x", "2_x"]
    np.testing.assert_allclose([float(r["gap_error"]) for r in table], [0, 0.13, math.sqrt(0.0041), 0.05], atol=1e-15)
    assert table[2]["exact_gap"] == "" and float(table[3]["exact_gap"]) == pytest.approx(0.8)
    assert (sector_sweep / "sector_spectrum.png").stat().st_size > 0
    assert not (sector_sweep / "sweep_energy.png").exists()  # nothing drawn against total_sz here
    with (sector_sweep / "report.csv").open() as f:
        assert [r["sector"] for r in csv.DictReader(f)][:2] == ["k=(0) A' P=+1", "k=(0) A' P=-1"]
