"""runner.report: run discovery, swept keys, status of unfinished runs, CSV, plots, exit status."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from runner import report
from runner.outputs import structure_factor_plot, sweep_plots, sweep_table
from tests.helpers.cli import REPO, run_cli
from tests.helpers.runs import completed, fake_run

SMALL = ["hilbert.L=8", "sampler.n_samples=256", "sampler.n_chains=8", "final_rounds=1", "n_iter=6"]


@pytest.fixture
def sweep(tmp_path):
    """Three finished runs over model.alpha, one killed, one still running."""
    common = ["hilbert.L=8", "n_iter=10"]
    for i, alpha in enumerate([1, 2, 4]):
        fake_run(tmp_path / f"{i}_model.alpha={alpha}", [f"model.alpha={alpha}", *common],
                 completed(-10.0 + 0.1 / alpha), energies=[-9.0, -9.5, -9.9])
    fake_run(tmp_path / "3_model.alpha=8", ["model.alpha=8", *common], energies=[-9.0, -9.2], age_s=3600)
    fake_run(tmp_path / "4_model.alpha=16", ["model.alpha=16", *common], energies=[-9.1])
    (tmp_path / "multirun.yaml").write_text("hydra: {}\n")
    (tmp_path / ".submitit" / "12_0").mkdir(parents=True)  # never searched
    return tmp_path


def test_collect_finds_every_run_with_its_status(sweep):
    rows = sorted(report.collect(sweep), key=report._sort_key)
    assert [r["run"] for r in rows] == [f"{i}_model.alpha={a}" for i, a in enumerate([1, 2, 4, 8, 16])]
    assert [r["status"] for r in rows] == ["completed"] * 3 + ["incomplete", "running"]
    assert [r["steps"] for r in rows] == ["10/10"] * 3 + ["2/10", "1/10"]
    assert rows[3]["energy"] == -9.2  # the latest step of a run without a summary
    assert report.swept_keys(rows) == ["model.alpha"]


def test_cli_prints_table_writes_csv_and_plots(sweep):
    proc = subprocess.run([sys.executable, "-m", "runner.report", str(sweep)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:4] == ["model.alpha", "status", "steps", "energy"]
    assert "5 run(s): 3 completed, 1 incomplete, 1 running" in proc.stdout
    with (sweep / "report.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["model.alpha"] for r in rows] == ["1", "2", "4", "8", "16"]
    assert float(rows[1]["energy"]) == pytest.approx(-9.95)
    assert float(rows[1]["relative_error"]) == pytest.approx(0.005)
    assert rows[0]["processes"] == "2" and rows[3]["processes"] == ""
    assert (sweep / "report.png").stat().st_size > 0
    assert (sweep / "convergence.png").stat().st_size > 0


def test_single_run_dir_and_non_numeric_sweep(tmp_path):
    run = fake_run(tmp_path / "a", ["model=rbm"], completed(-9.9), energies=[-9.0, -9.9])
    fake_run(tmp_path / "b", ["model=jastrow"], completed(-9.8), energies=[-9.0, -9.8])
    assert report.main([str(run), "--no-plots"]) == 0
    assert (run / "report.csv").exists()
    assert report.main([str(tmp_path)]) == 0
    assert not (tmp_path / "report.png").exists()  # model is not a numeric parameter
    assert (tmp_path / "convergence.png").exists()


def test_run_whose_log_records_a_failed_process_is_failed(tmp_path):
    run = fake_run(tmp_path / "0_x=1", ["x=1"], energies=[-9.0], age_s=3600)
    (run / "cli.log").write_text("[2026-01-01 00:00:00,000][runner.app][ERROR] - process 1 of 2 failed\n"
                                 "Traceback (most recent call last):\nRuntimeError: boom\n")
    (row,) = report.collect(tmp_path)
    assert row["status"] == "failed"


def test_no_runs_exits_2_with_one_sentence(tmp_path):
    (tmp_path / "empty").mkdir()
    for target in (tmp_path / "empty", tmp_path / "missing"):
        proc = subprocess.run([sys.executable, "-m", "runner.report", str(target)], capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 2
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_report_of_a_real_local_sweep(tmp_path):
    run_cli(["-m", *SMALL, "model.alpha=1,2", "exact=true", f"hydra.sweep.dir={tmp_path}"], REPO, check=True)
    rows = report.report(tmp_path)
    assert [r["overrides"]["model.alpha"] for r in rows] == ["1", "2"]
    assert all(r["status"] == "completed" and r["relative_error"] is not None for r in rows)
    assert all(r["processes"] == 1 for r in rows)
    assert (tmp_path / "report.png").exists() and (tmp_path / "convergence.png").exists()


def test_warnings_column_and_runs_that_did_not_complete_are_marked(tmp_path, capsys):
    warned = completed(-8.0, r_hat=2.0, warnings=[{"name": "r_hat", "message": "split R-hat 2.000 is above 1.1"},
                                                  {"name": "relative_error", "message": "relative error 2e-01"}])
    fake_run(tmp_path / "0_x=1", ["x=1"], completed(-9.99), energies=[-9.0, -9.99])
    fake_run(tmp_path / "1_x=2", ["x=2"], warned, energies=[-9.0, -8.0])
    fake_run(tmp_path / "2_x=3", ["x=3"], {"status": "failed", "reason": "energy is nan at step 3",
                                            "n_iter": 10, "steps_done": 4}, energies=[-9.0, -9.1])
    fake_run(tmp_path / "3_x=4", ["x=4"], {"status": "preempted", "reason": "SIGTERM received; stopped at step 2",
                                            "n_iter": 10, "steps_done": 2}, energies=[-9.0, -9.1])
    rows = report.report(tmp_path, plots=False)
    out = capsys.readouterr().out
    header, cells = sweep_table.table(rows, ["x"])
    assert header[-1] == "warnings"
    assert [c[1] for c in cells] == ["completed", "completed", "failed !", "preempted !"]
    assert [c[-1] for c in cells] == ["-", "r_hat,relative_error", "-", "-"]
    assert "! 2_x=3: failed: energy is nan at step 3" in out
    assert "! 3_x=4: preempted: SIGTERM received; stopped at step 2" in out
    assert "1_x=2: warning [r_hat]: split R-hat 2.000 is above 1.1" in out
    with (tmp_path / "report.csv").open() as f:
        csv_rows = list(csv.DictReader(f))
    assert [r["warnings"] for r in csv_rows] == ["", "r_hat;relative_error", "", ""]
    assert csv_rows[2]["reason"] == "energy is nan at step 3"


def test_plots_have_error_bars(tmp_path):
    for i, alpha in enumerate([1, 2]):
        fake_run(tmp_path / f"{i}_a={alpha}", [f"a={alpha}"], completed(-10.0 + 0.1 / alpha),
                 energies=[-9.0, -9.5, -9.9])
    rows = sorted(report.collect(tmp_path), key=report._sort_key)
    sweep_fig = sweep_plots.plot_sweep(rows, "a", tmp_path / "report.png")
    (ax,) = sweep_fig.axes
    assert ax.get_yscale() == "log" and len(ax.containers) == 1  # relative error with error bars
    conv_fig = sweep_plots.plot_convergence(rows, ["a"], tmp_path / "convergence.png")
    energy_ax, rel_ax = conv_fig.axes
    assert len(energy_ax.collections) == 2  # one error band per run
    assert len(rel_ax.containers) == 2  # relative error with error bars per run


@pytest.mark.slow
def test_report_of_a_real_sweep_over_sectors(tmp_path, capsys):
    """Heisenberg chain L=6, S^z=0: the singlet ground state (k=0, P=+1) and the lowest triplet
    level there (k=pi, P=-1), each by a projected RBM; their gap against the exact one of spectrum.json.
    (A GCNN of 4 features at its start of readout 10/sqrt(F) missed the triplet by 2.4 in 20 steps.)"""
    sectors = "{momentum:[0],irrep:\"A'\",parity:1},{momentum:[3],irrep:\"A'\",parity:-1}"
    run_cli(["-m", "hilbert=chain", "hilbert.L=6", "hamiltonian=heisenberg", "hilbert.total_sz=0",
             "sampler=metropolis_exchange", "model=rbm", "model.alpha=2", "n_iter=20", "sampler.n_samples=256",
             "sampler.n_chains=8", "final_rounds=1", "exact=true", f"model.sector={sectors}",
             f"hydra.sweep.dir={tmp_path}"], REPO, check=True)
    rows = report.report(tmp_path)
    assert [r["sector"] for r in rows] == ["k=(0) A' P=+1", "k=(3) A' P=-1"]
    with (tmp_path / "gaps.csv").open() as f:
        low, triplet = csv.DictReader(f)
    spectrum = json.loads((rows[0]["path"] / "spectrum.json").read_text())["levels"]
    exact_gap = spectrum["k=(3) A' P=-1"][0] - spectrum["k=(0) A' P=+1"][0]
    assert float(triplet["exact_gap"]) == pytest.approx(exact_gap, abs=1e-9)
    assert abs(float(triplet["gap"]) - exact_gap) < 5 * float(triplet["gap_error"]) + 1e-3 * exact_gap
    assert (tmp_path / "sector_spectrum.png").is_file()
    assert "gaps above the lowest run (0: k=(0) A' P=+1, total_sz 0)" in capsys.readouterr().out


def fake_dynamics(path, overrides, records, exact=None, summary=True):
    """A time-evolution run directory: trajectory.jsonl (t, energy, obs/mx), exact_trajectory.json
    and, when finished, summary.json with its max_abs_error."""
    fake_run(path, overrides, files={"exact_trajectory.json": exact} if exact else None)
    (path / "trajectory.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if summary:
        errors = None if exact is None else {
            key: max(abs(r[key] - e) for r, e in zip(records, exact[key])) for key in ("energy", "obs/mx")}
        (path / "summary.json").write_text(json.dumps({
            "task": "dynamics", "status": "completed", "t_reached": records[-1]["t"], "t_end": 0.2,
            "energy": records[-1]["energy"], "energy_error": records[-1]["energy_error"], "max_abs_error": errors}))
    return path


def test_a_sweep_of_time_evolutions_is_plotted_against_t(tmp_path, capsys):
    """Every run's observables against t in one figure (one curve each, exact dashed), its time
    reached in the steps column and its largest |error| over the observables in the table and CSV;
    a trajectory without a summary is a run still going."""
    for i, h in enumerate([0.5, 1.0]):
        records = [{"t": t, "energy": -h * 6, "energy_error": 0.0, "obs/mx": 1 - h * t, "obs/mx_error": 0.01}
                   for t in (0.0, 0.1, 0.2)]
        exact = {"t": [0.0, 0.1, 0.2], "energy": [-h * 6] * 3, "obs/mx": [1 - h * t + 0.002 * i for t in (0.0, 0.1, 0.2)]}
        fake_dynamics(tmp_path / f"{i}_hamiltonian.h={h}", ["task=dynamics", f"hamiltonian.h={h}"], records, exact)
    fake_dynamics(tmp_path / "2_hamiltonian.h=2.0", ["task=dynamics", "hamiltonian.h=2.0"],
                  [{"t": 0.0, "energy": -12.0, "energy_error": 0.0, "obs/mx": 1.0}], summary=False)
    rows = report.report(tmp_path)
    assert [r["status"] for r in rows] == ["completed", "completed", "running"]
    assert [r["steps"] for r in rows] == ["t 0.2/0.2", "t 0.2/0.2", "t 0/-"]
    assert rows[0]["max_abs_error"] == 0.0 and rows[1]["max_abs_error"] == pytest.approx(0.002)
    assert rows[2]["energy"] == -12.0
    out = capsys.readouterr().out
    assert "max |error|" in out and "2.00e-03" in out
    assert (tmp_path / report.DYNAMICS_PLOT).stat().st_size > 0
    written = [row["max_abs_error"] for row in csv.DictReader((tmp_path / "report.csv").open())]
    assert written[2] == "" and [float(v) for v in written[:2]] == [0.0, pytest.approx(0.002)]


@pytest.mark.slow
def test_report_of_a_real_sweep_of_quenches(tmp_path):
    """Two quenches of a Jastrow chain from |+x> (full sum, to t = 0.2): the report reads their
    trajectories and exact curves and plots them side by side."""
    run_cli(["-m", "task=dynamics", "hilbert.L=6", "model=jastrow", "dtype=complex128", "sampler=full_sum",
             "observables=spin", "task.t_end=0.2", "task.integrator.dt=0.02", "hamiltonian.h=0.5,1.0",
             f"hydra.sweep.dir={tmp_path}"], REPO, check=True)
    rows = report.report(tmp_path)
    assert [r["overrides"]["hamiltonian.h"] for r in rows] == ["0.5", "1.0"]
    assert all(r["status"] == "completed" and r["steps"] == "t 0.2/0.2" for r in rows)
    assert all(len(r["trajectory"]) == 3 and r["exact_trajectory"] is not None for r in rows)
    assert all(r["max_abs_error"] < 1e-2 for r in rows)  # the Jastrow quench is not exact: a loose bound
    assert (tmp_path / report.DYNAMICS_PLOT).stat().st_size > 0


def test_the_run_reported_as_dot_is_named_by_its_directory(tmp_path, monkeypatch):
    """`python -m runner.report .` in a run directory: the legends name the directory, not "."."""
    momenta = np.linspace(0, 2 * np.pi, 6, endpoint=False)
    correlations = {"momenta": [[q] for q in momenta], "structure_factor": list(1 + np.cos(momenta - np.pi)),
                    "exact_structure_factor": list(1.1 + np.cos(momenta - np.pi))}
    run = fake_run(tmp_path / "heis_L6", ["hilbert.L=6"], completed(-9.9), energies=[-9.0, -9.9],
                   files={"correlations.json": correlations})
    drawn = {}
    plot = structure_factor_plot.plot_structure_factor
    monkeypatch.setattr(structure_factor_plot, "plot_structure_factor",
                        lambda runs, labels, path: drawn.setdefault("fig", plot(runs, labels, path)))
    monkeypatch.chdir(run)
    assert report.main(["."]) == 0
    (row,) = report.collect(Path("."))
    assert row["run"] == "." and sweep_plots.run_label(row, []) == "heis_L6"
    legend = [t.get_text() for t in drawn["fig"].axes[0].get_legend().get_texts()]
    assert sorted(legend) == ["exact, heis_L6", "heis_L6"]
    assert (run / report.STRUCTURE_FACTOR_PLOT).stat().st_size > 0
