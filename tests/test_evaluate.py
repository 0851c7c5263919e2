"""python -m runner.evaluate: a run's checkpoint re-estimated with more samples, on any backend,
into evaluation.json (summary.json untouched); physics overrides refused."""

import json
import math

import pytest

from tests.helpers.cli import REPO, evaluated, run_cli, run_evaluate

RUN = ["hilbert.L=8", "sampler.n_samples=256", "sampler.n_chains=8", "final_rounds=2", "exact=auto", "n_iter=20"]
MORE = ["sampler.n_samples=4096", "final_rounds=4"]  # 4096 samples in all: 4 rounds of 1024


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("evaluate") / "run"
    run_cli([*RUN, f"hydra.run.dir={run_dir}"], REPO, check=True)
    return run_dir


def summary_bytes(run_dir):
    return (run_dir / "summary.json").read_bytes()


@pytest.mark.slow
def test_the_run_settings_reproduce_the_final_estimate_exactly(run):
    """Same chains, keys and sample counts as the run's final estimate: the same numbers."""
    before = summary_bytes(run)
    result = evaluated(run, [])
    summary = json.loads(before)
    for key in ("energy", "energy_error", "variance", "v_score", "peak_check"):
        assert result[key] == summary[key], key
    assert result["peak_check"]["method"] == "exhaustive"
    assert result["chains"] == "checkpoint" and result["step"] == 20 and result["total_samples"] == 512
    assert result["burn_in_sweeps"] == 0 and summary["final_burn_in"] == 0  # trained on |psi|^2: no switch
    assert summary_bytes(run) == before


@pytest.mark.slow
def test_a_reweighted_run_burns_in_and_its_evaluation_reproduces_it(tmp_path):
    """Trained on samples of |psi| (machine_pow 1): the final estimate discards 16 sweeps per chain
    before sampling |psi|^2, and the evaluation with the run's settings does the same (the same
    numbers)."""
    run_dir = tmp_path / "run"
    run_cli([*RUN, "sampler.machine_pow=1", "n_iter=10", f"hydra.run.dir={run_dir}"], REPO, check=True)
    summary = json.loads(summary_bytes(run_dir))
    assert summary["final_burn_in"] == 16
    result = evaluated(run_dir, [])
    assert result["burn_in_sweeps"] == 16 and result["chains"] == "checkpoint"
    for key in ("energy", "energy_error", "variance"):
        assert result[key] == summary[key], key


def test_more_samples_agree_within_error_bars_and_leave_the_summary(run):
    before = summary_bytes(run)
    proc = run_evaluate([run, *MORE])
    assert proc.returncode == 0, proc.stderr
    assert "evaluating with 4096 samples (4 rounds of 1024 over 8 chains)" in proc.stderr
    result = json.loads((run / "evaluation.json").read_text())
    summary = json.loads(before)
    assert result["total_samples"] == 4096 and result["n_samples"] == 1024 and result["chains"] == "checkpoint"
    assert result["energy_error"] < summary["energy_error"]
    assert abs(result["energy"] - summary["energy"]) < 4 * math.hypot(result["energy_error"], summary["energy_error"])
    assert result["relative_error"] == pytest.approx(abs(result["energy"] - summary["exact_energy"]) / abs(summary["exact_energy"]))
    assert summary_bytes(run) == before


@pytest.mark.slow
def test_sharded_evaluation_equals_single_device(run):
    single = evaluated(run, MORE)
    sharded = evaluated(run, [*MORE, "parallel=sharded", "parallel.cpu_devices=2"])
    assert sharded["devices"] == 2 and sharded["backend"] == "sharded" and single["devices"] == 1
    for key in ("energy", "energy_error", "variance"):
        assert sharded[key] == pytest.approx(single[key], rel=1e-12, abs=1e-12), key


def test_another_seed_draws_fresh_chains_and_observables_on_request(run):
    result = evaluated(run, [*MORE, "seed=7", "observables=spin"])
    summary = json.loads(summary_bytes(run))
    assert result["chains"] == "fresh (seed 7)" and result["burn_in_sweeps"] == 16
    assert abs(result["energy"] - summary["energy"]) < 4 * math.hypot(result["energy_error"], summary["energy_error"])
    mx = result["observables"]["magnetization_x"]
    assert 0 < mx["mean"] <= 1 and mx["error"] > 0  # TFIM at h=1: polarised along +x


@pytest.mark.parametrize(
    "override,expected",
    [
        ("hamiltonian.h=2.0", "hamiltonian.h is 2.0 in the overrides but 1.0 in the run"),
        ("dtype=complex128", "dtype.name is complex128 in the overrides but float64 in the run"),
    ],
)
def test_physics_overrides_are_refused_in_one_sentence(run, override, expected):
    proc = run_evaluate([run, override])
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and expected in lines[0], proc.stderr


def test_a_sweep_run_directory_with_overrides_in_its_name(run, tmp_path):
    import shutil

    job = shutil.copytree(run, tmp_path / "1_hamiltonian.h=1.0,seed=0")
    assert evaluated(job, [])["energy"] == json.loads(summary_bytes(run))["energy"]
    proc = run_evaluate(["sampler.n_samples=64"])  # no run directory given
    assert proc.returncode == 2 and proc.stderr.startswith("usage:")


def test_a_directory_that_is_not_a_run_is_one_sentence(tmp_path):
    proc = run_evaluate([tmp_path])
    assert proc.returncode == 2 and "holds no .hydra/config.yaml" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_the_symmetry_projection_of_the_trained_parameters_is_evaluated_exactly(tmp_path):
    """model.sector may be overridden: the run's parameters, the state projected on the chain's
    k=(0) A' P=+1 sector (the space group's trivial irrep, even under the flip); its full-sum energy
    equals the dense <psi_P|H|psi_P> / <psi_P|psi_P> of psi_P(s) = sum_g sum_f parity^f psi(f g s)
    built here from the unprojected log psi. Another model key is still refused."""
    import numpy as np

    import runner
    from runner.physics.hilbert import all_states
    from tests.helpers.dense import basis_index, dense_ising

    run_dir = tmp_path / "run"
    run_cli([*RUN, "model=rbm_symm", "n_iter=10", f"hydra.run.dir={run_dir}"], REPO, check=True)
    result = evaluated(run_dir, ["sampler=full_sum", "model.sector={momentum:[0],irrep:\"A'\",parity:1}"])
    assert result["projection"] == {"model.sector": [None, {"momentum": [0], "irrep": "A'", "parity": 1}]}
    assert result["burn_in_sweeps"] == 0  # a full sum has no chains

    trained = runner.load(run_dir)
    n = 8
    states = np.asarray(all_states(trained.hilbert), np.int8)
    sites = np.arange(n)
    images = [(sites + k) % n for k in range(n)] + [(k - sites) % n for k in range(n)]  # translations, reflections
    psi_P = np.zeros(2**n, complex)
    for perm in images:
        for flip in (1, -1):  # parity +1
            psi_P[basis_index(states)] += np.exp(np.asarray(trained.log_psi(flip * states[:, perm])))
    H = dense_ising([(i, (i + 1) % n) for i in range(n)], n, 1.0, 1.0)
    exact = np.real(np.vdot(psi_P, H @ psi_P) / np.vdot(psi_P, psi_P))
    assert result["energy"] == pytest.approx(exact, rel=1e-10)
    assert evaluated(run_dir, ["sampler=full_sum"])["projection"] is None
    proc = run_evaluate([run_dir, "model.alpha=2"])
    assert proc.returncode == 2 and "model.alpha is 2 in the overrides but 1 in the run" in proc.stderr


def test_an_overridden_n_samples_is_the_total_split_over_the_rounds():
    from runner.errors import ConfigError
    from runner.evaluate import split_total

    config = {"sampler": {"n_samples": 4096, "n_chains": 8}, "final_rounds": 4}
    assert split_total(config, ["sampler.n_samples=4096"])["sampler"]["n_samples"] == 1024
    assert split_total(config, ["final_rounds=4"]) == config  # the run's own rounds of n_samples
    with pytest.raises(ConfigError) as err:
        split_total({**config, "final_rounds": 3}, ["sampler.n_samples=4096"])
    assert err.value.sentence() == ("sampler.n_samples is the total an evaluation draws in final_rounds=3 rounds "
                                    "and must be a multiple of it (got 4096).")


def test_stored_overrides_of_a_retired_key_are_skipped(tmp_path):
    """A run from before model.activation of the CNN was retired (fingerprint.RETIRED) recorded it in
    .hydra/overrides.yaml: the evaluation's composition leaves it out (and the stored config's)."""
    import yaml

    from runner.evaluate import compose_config
    from tests.helpers.config import compose_config as composed

    overrides = ["model=cnn", "model.activation=log_cosh", "hilbert.L=4"]
    config = composed([o for o in overrides if "activation" not in o])
    config["model"]["activation"] = "log_cosh"
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    (tmp_path / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    evaluated_config = compose_config(tmp_path, ["sampler.n_samples=512"])
    assert "activation" not in evaluated_config["model"] and evaluated_config["sampler"]["n_samples"] == 512
    assert evaluated_config["hilbert"]["L"] == 4
