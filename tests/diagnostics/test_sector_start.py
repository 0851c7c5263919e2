"""The sector check of a run where the exact solver runs (issue 56 item 9): said before the first
step, and the run's last line gives the relative error against the ground state and against the
lowest level of the model's sector."""

import json

import pytest

from tests.helpers.config import KAGOME, compose_config

SMALL = ["n_iter=2", "exact=true", "sampler.n_samples=64", "sampler.n_chains=8", "final_rounds=1",
         "peak_search=0", "dtype=complex128"]


@pytest.fixture(scope="module")
def a1_run(tmp_path_factory):
    """Kagome 2x2, whose ground state lies in k=(0,0) B1 P=+1, with the model held in A1."""
    import logging

    from runner import app
    from runner.config.build import build
    from runner.parallel import mesh

    run_dir = tmp_path_factory.mktemp("a1") / "run"
    messages = []

    class Keep(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    handler, logger = Keep(level=logging.INFO), logging.getLogger("runner")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        experiment = build(compose_config([*KAGOME, "model.sector={momentum: [0, 0], irrep: A1, parity: 1}", *SMALL]))
        summary = app.execute(experiment, mesh.make_mesh("single"), run_dir)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    return run_dir, summary, messages


def test_the_sector_is_said_before_the_first_step(a1_run):
    run_dir, summary, messages = a1_run
    early = [i for i, m in enumerate(messages) if m.startswith("sector warning before the first step")]
    assert len(early) == 1, messages
    assert "k=(0,0) A1 P=+1" in messages[early[0]] and "k=(0,0) B1 P=+1" in messages[early[0]]
    steps = [i for i, m in enumerate(messages) if m.startswith("step ")]
    status = messages.index("status: completed")
    assert early[0] < status and all(early[0] < i for i in steps), messages
    # still in the summary's warnings at the end, with the spectrum kept for spectrum.json
    assert "sector" in [w["name"] for w in summary["warnings"]]
    assert json.loads((run_dir / "spectrum.json").read_text())["ground_sector"] == "k=(0,0) B1 P=+1"


def test_the_last_line_gives_both_relative_errors(a1_run):
    _, summary, messages = a1_run
    line = next(m for m in messages if m.startswith("relative error:"))
    assert f"{summary['relative_error']:.2e} against the ground state" in line
    assert f"{summary['sector_relative_error']:.2e} against the lowest level of sector k=(0,0) A1 P=+1" in line
    # the report's last line (the health warnings follow it)
    report = messages[messages.index("status: completed"):]
    assert [m for m in report if not m.startswith("health warning")][-1] == line


def test_beyond_the_lanczos_limit_the_exact_energy_is_the_spectrum_by_sectors(monkeypatch, tmp_path):
    """Where `exact: auto` runs the spectrum by sector but not the whole space's Lanczos, the run's
    exact energy and relative errors are the spectrum's (the ground sector's lowest level)."""
    from runner import app
    from runner.config.build import build
    from runner.parallel import mesh
    from runner.physics import exact

    monkeypatch.setattr(exact, "AUTO_MAX_STATES", 100)  # kagome 2 x 2 at Sz = 0: 924 states
    experiment = build(compose_config([*KAGOME, "model.sector=auto", *SMALL, "exact=auto"]))
    summary = app.execute(experiment, mesh.make_mesh("single"), tmp_path / "run")
    assert abs(summary["exact_energy"] - exact.ground_energy(experiment.hamiltonian, experiment.hilbert)) < 1e-10
    assert summary["exact_sector"] == summary["sector"] == "k=(0,0) B1 P=+1"
    assert summary["relative_error"] == pytest.approx(summary["sector_relative_error"], rel=1e-12)
