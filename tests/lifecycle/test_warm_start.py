"""Warm starts (runner.lifecycle.load, init_from): parameters and chains from another run on any layout,
mismatches refused, the source in the fingerprint, and `init_from: previous` chaining a sweep."""

import json
import math
from pathlib import Path

import jax
import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from runner.config.build import build
from runner.errors import ConfigError
from runner.lifecycle import load, warm_start
from runner.parallel import mesh
from tests.helpers.cli import REPO, run_cli

SMALL = ["hilbert.L=8", "sampler.n_samples=512", "sampler.n_chains=8", "final_rounds=4", "checkpoint_every=1000"]


def summary_of(run_dir):
    return json.loads((Path(run_dir) / "summary.json").read_text())


def metrics_of(run_dir):
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def composed(overrides):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return OmegaConf.to_container(compose("config", overrides=[*SMALL, *overrides]), resolve=True)


def built(overrides):
    """The experiment of `overrides` with its warm start resolved, as a run resolves it."""
    config = composed(overrides)
    return warm_start.resolve(build(config), config)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A 30-step run to start from."""
    run_dir = tmp_path_factory.mktemp("source") / "run"
    run_cli([*SMALL, "n_iter=30", f"hydra.run.dir={run_dir}"], REPO, check=True)
    return run_dir


@pytest.mark.slow
def test_warm_start_begins_at_the_source_final_energy(source, tmp_path):
    run_dir = tmp_path / "warm"
    run_cli([*SMALL, "n_iter=2", f"init_from={source}", f"hydra.run.dir={run_dir}"], REPO, check=True)
    final = summary_of(source)
    first = metrics_of(run_dir)[0]
    sigma = math.hypot(first["energy_error"], final["energy_error"])
    assert abs(first["energy"] - final["energy"]) < 4 * sigma, (first, final)
    cold = metrics_of(source)[0]  # the same config's first step from scratch: far away
    assert abs(cold["energy"] - final["energy"]) > 10 * math.hypot(cold["energy_error"], final["energy_error"])
    stamp = summary_of(run_dir)["config_fingerprint"]["config"]
    assert stamp["init_from.fingerprint"] == final["config_fingerprint"]["hash"]
    assert stamp["init_from.step"] == 30 and stamp["init_from.chains"] is False
    assert "init_from" not in final["config_fingerprint"]["config"]  # a cold start's fingerprint is unchanged


@pytest.mark.parametrize("backend", ["single", "sharded"])
@pytest.mark.parametrize("chains", [False, True])
def test_warm_start_places_the_source_parameters_and_optionally_its_chains(source, backend, chains):
    """The source ran on one device; the warm start may lay its state out over four."""
    from runner.lifecycle.ground_state import place_state

    experiment = built([f"init_from={source}", f"init_chains={str(chains).lower()}"])
    layout = mesh.make_mesh(backend)
    cold, shardings = place_state(experiment.problem, experiment.settings, layout)
    warm = warm_start.warm_start(experiment, cold, shardings)
    stored = load.load(source).state
    for got, want in zip(jax.tree_util.tree_leaves(warm.params), jax.tree_util.tree_leaves(stored.params)):
        np.testing.assert_array_equal(np.asarray(got), want)
    same_chains = np.array_equal(np.asarray(warm.chains.sigma_CxN), stored.chains.sigma_CxN)
    assert same_chains == chains
    assert warm.chains.sigma_CxN.sharding == shardings.chains.sigma_CxN


@pytest.mark.parametrize(
    "change,expected",
    [
        ("model.alpha=2", "model.alpha is 2 in this config but 1 in the run init_from="),
        ("hilbert.pbc=false", "hilbert.pbc is false in this config but true in the run init_from="),
        ("dtype=complex128", "dtype.name is complex128 in this config but float64 in the run init_from="),
    ],
)
def test_a_source_of_another_model_lattice_or_dtype_is_refused(source, change, expected):
    with pytest.raises(ConfigError) as err:
        built([change, f"init_from={source}"])
    assert expected in err.value.sentence() and "a warm start needs the same model, lattice and dtype" in err.value.sentence()


def test_another_size_of_a_model_that_cannot_transfer_is_refused(source):
    """An RBM's hidden units belong to its N sites: no transfer (tests/lifecycle/test_transfer.py)."""
    with pytest.raises(ConfigError) as err:
        built(["hilbert.L=10", f"init_from={source}"])
    sentence = err.value.sentence()
    assert sentence.startswith("hilbert.L is 10 in this config but 8 in the run init_from=") and "model RBM" in sentence


def test_chains_of_another_count_are_refused_but_parameters_are_taken(source):
    with pytest.raises(ConfigError, match="sampler.n_chains is 16 in this config but 8"):
        built(["sampler.n_chains=16", f"init_from={source}", "init_chains=true"])
    assert built(["sampler.n_chains=16", f"init_from={source}"]).settings.init_from.step == 30


def test_refusal_on_the_command_line_is_one_sentence_before_compiling(source, tmp_path):
    proc = run_cli([*SMALL, "model.alpha=2", f"init_from={source}", f"hydra.run.dir={tmp_path / 'run'}"], REPO)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("Config error: model.alpha is 2"), proc.stderr
    assert not (tmp_path / "run").exists()


def test_a_directory_without_checkpoint_or_chains_without_a_source_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="holds no checkpoint"):
        built([f"init_from={tmp_path}"])
    with pytest.raises(ConfigError, match="init_chains is true but init_from is null"):
        built(["init_chains=true"])


def write_job(sweep, name, num, status=None):
    job = sweep / name
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "hydra.yaml").write_text(f"hydra:\n  job:\n    name: cli\n    num: {num}\n")
    if status:
        (job / "summary.json").write_text(json.dumps({"status": status}))
    return job


def test_previous_is_the_job_before_by_hydra_record_and_must_have_completed(tmp_path):
    config = composed(["init_from=previous"])
    assert warm_start.source(config, sweep_job=None) is None  # not in a sweep: cold
    assert warm_start.source(config, sweep_job=(tmp_path, 0)) is None  # the first job: cold
    write_job(tmp_path, "0_h=0.5", 0, status="completed")
    second = write_job(tmp_path, "weird/name", 1)  # any subdir layout: found by the recorded number
    assert warm_start.job_dir(tmp_path, 1) == second and warm_start.job_dir(tmp_path, 7) is None
    with pytest.raises(ConfigError, match="job 1 of the sweep .* has status unknown"):
        warm_start.source(config, sweep_job=(tmp_path, 2))
    with pytest.raises(ConfigError, match="has no run directory"):
        warm_start.source(config, sweep_job=(tmp_path, 9))
    with pytest.raises(ConfigError, match="holds no checkpoint"):  # completed, found, but no checkpoint
        warm_start.source(config, sweep_job=(tmp_path, 1))


def steps_to(run_dir, tolerance):
    """The first step whose energy is within `tolerance` (relative) of the exact ground energy."""
    exact = summary_of(run_dir)["exact_energy"]
    return next(m["step"] for m in metrics_of(run_dir) if abs(m["energy"] - exact) < tolerance * abs(exact))


@pytest.mark.slow
def test_a_chained_sweep_converges_in_fewer_steps_than_cold_starts(tmp_path):
    chain = ["hilbert.L=10", "sampler.n_samples=512", "sampler.n_chains=8", "final_rounds=2", "n_iter=40"]
    warm, cold = tmp_path / "warm", tmp_path / "cold"
    run_cli(["-m", *chain, "init_from=previous", "hamiltonian.h=0.8,1.0,1.2", f"hydra.sweep.dir={warm}"], REPO,
            check=True, timeout=600)
    run_cli(["-m", *chain, "hamiltonian.h=1.0,1.2", f"hydra.sweep.dir={cold}"], REPO, check=True, timeout=600)
    job = lambda sweep, h: next(p for p in sweep.iterdir() if f"hamiltonian.h={h}," in p.name)  # noqa: E731
    for h in (1.0, 1.2):
        warm_steps, cold_steps = steps_to(job(warm, h), 1e-2), steps_to(job(cold, h), 1e-2)
        print(f"h={h}: steps to 1e-2 relative error: warm {warm_steps}, cold {cold_steps}")
        assert warm_steps < cold_steps / 2, (h, warm_steps, cold_steps)
    # the chain is part of each point's fingerprint: re-running the sweep skips every point
    proc = run_cli(["-m", *chain, "init_from=previous", "hamiltonian.h=0.8,1.0,1.2", f"hydra.sweep.dir={warm}"], REPO,
                   check=True, timeout=600)
    assert (proc.stdout + proc.stderr).count("already completed") == 3
