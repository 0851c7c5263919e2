"""conf/experiment and conf/debug: every experiment composes and builds, the benchmark cases are
bench/run.py's, debug=fast runs any config end to end in seconds, the phase diagram sweeps h."""

import importlib.util
import json

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from runner.config import monte_carlo
from runner.config.build import build, instantiate
from runner.physics import hamiltonians, pauli
from tests.helpers.cli import REPO, run_cli

EXPERIMENTS = sorted(p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml"))


def composed(overrides, hydra=False):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides), return_hydra_config=hydra)
    return OmegaConf.to_container(cfg, resolve=not hydra)


def bench_cases():
    spec = importlib.util.spec_from_file_location("bench_run", REPO / "bench" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.CASES


def test_the_required_experiments_exist():
    assert {"tfim1d", "heis1d", "tfim2d", "j1j2_square", "tfim_phase_diagram"} <= set(EXPERIMENTS)


@pytest.mark.parametrize("debug", [[], ["debug=fast"]])
@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_composes_and_builds(name, debug):
    config = composed([f"experiment={name}", *debug])
    # `previous` is resolved in a sweep; a quench from a trained state names the run it evolves
    needs_run = (config.get("task") or {}).get("initial_state") == "init_from"
    experiment = build({**config, "init_from": "outputs/RUN" if needs_run else None})
    ran = monte_carlo.resolve(config, instantiate)  # with its Monte Carlo set-up, if any
    assert experiment.settings.n_iter == (5 if debug else ran["n_iter"])
    if debug:
        assert config["exact"] is False and config["sampler"]["n_samples"] == 128 and config["final_rounds"] == 1


@pytest.mark.parametrize("case", ["tfim1d", "heis1d", "tfim2d"])
def test_benchmark_experiments_are_the_bench_cases(case):
    """experiment=CASE composes exactly what bench/run.py's overrides for the case compose."""
    assert composed([f"experiment={case}"]) == composed(bench_cases()[case])


def test_j1j2_square_is_the_frustrated_heisenberg_model_and_scales_with_L():
    config = composed(["experiment=j1j2_square"])
    assert config["hamiltonian"]["J2"] == 0.5 and config["hamiltonian"]["phase_prior"] == "marshall"
    assert config["hilbert"]["L"] == 4 and config["hilbert"]["total_sz"] == 0
    assert config["sampler"]["_target_"].endswith("metropolis_exchange") and config["dtype"]["name"] == "complex128"
    experiment = build(composed(["experiment=j1j2_square", "hilbert.L=6"]))
    assert experiment.hilbert.n_sites == 36 and len(experiment.hilbert.next_bonds) == 72
    assert experiment.hamiltonian.rotated is not None  # the Marshall rotation, asked for explicitly


@pytest.mark.parametrize("torus,three", [(["hilbert.L=6"], True),
                                         (["hilbert.L=null", "hilbert.Lx=4", "hilbert.Ly=6"], False)])
def test_heisenberg_cnn_takes_the_spiral_prior_on_any_torus(torus, three):
    """The recipe's spiral is the 120-degree pattern's H on 6 x 6 and a rotation that keeps every translation (so
    the translation-invariant CNN can follow the ground state) on 4 x 6, where three_sublattice does not fit."""
    experiment = build(composed(["experiment=heisenberg_cnn", *torus]))
    lattice, ham = experiment.hilbert, experiment.hamiltonian
    assert ham.rotated and pauli.not_invariant_under(ham, lattice.space_group.rows("translations")) is None
    assert (lattice.three_sublattice is not None) == three
    if three:
        three_sublattice = hamiltonians.heisenberg(lattice, phase_prior="three_sublattice")
        other = {(ops, sites): c for c, ops, sites in three_sublattice.terms}
        assert {(ops, sites) for _, ops, sites in ham.terms} == other.keys()
        assert all(abs(c - other[ops, sites]) < 1e-12 for c, ops, sites in ham.terms)


def test_phase_diagram_sweeps_h_and_chains_its_points():
    config = composed(["experiment=tfim_phase_diagram"], hydra=True)
    assert config["hydra"]["sweeper"]["params"] == {"hamiltonian.h": "0.5,0.8,1.0,1.2,1.5"}
    assert config["init_from"] == "previous" and config["hilbert"]["L"] == 10
    assert config["observables"]["_target_"] == "runner.physics.observables.spin"


def test_an_unknown_experiment_is_one_sentence(tmp_path):
    proc = run_cli(["experiment=nope", f"hydra.run.dir={tmp_path / 'run'}"], REPO)
    assert proc.returncode == 2 and "experiment=nope is not an option" in proc.stderr
    assert "j1j2_square" in proc.stderr and "Traceback" not in proc.stderr


def test_debug_fast_runs_an_experiment_end_to_end(tmp_path):
    run_dir = tmp_path / "run"
    run_cli(["experiment=j1j2_square", "debug=fast", f"hydra.run.dir={run_dir}"], REPO, check=True, timeout=120)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps_done"] == 5 and summary["n_samples"] == 128
    assert summary["exact_energy"] is None and summary["n_sites"] == 16 and summary["dtype"] == "complex128"


@pytest.mark.slow
def test_phase_diagram_multirun_warm_starts_each_point_from_the_previous(tmp_path):
    sweep = tmp_path / "sweep"
    run_cli(["-m", "experiment=tfim_phase_diagram", "debug=fast", f"hydra.sweep.dir={sweep}"], REPO, check=True,
            timeout=600)
    runs = sorted((p for p in sweep.iterdir() if (p / "summary.json").is_file()), key=lambda p: int(p.name.split("_")[0]))
    summaries = [json.loads((p / "summary.json").read_text()) for p in runs]
    stamps = [s["config_fingerprint"]["config"] for s in summaries]
    assert [s["hamiltonian.h"] for s in stamps] == [0.5, 0.8, 1.0, 1.2, 1.5]
    assert all(s["status"] == "completed" for s in summaries)
    assert all("magnetization_x" in s["observables"] for s in summaries)
    assert "init_from.fingerprint" not in stamps[0]  # the first point starts cold
    for before, after in zip(summaries, stamps[1:]):
        assert after["init_from.fingerprint"] == before["config_fingerprint"]["hash"] and after["init_from.step"] == 5
