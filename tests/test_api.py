"""runner.load (runner.api): a trained run in Python, checked against the model on the checkpoint's
parameters and against dense expectation values summed over the whole basis."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import runner
from models import RBM
from runner.physics.hilbert import all_states
from tests.helpers.cli import REPO, run_cli
from tests.helpers.dense import dense_pauli, dense_psi

EXACT = ["hilbert.L=6", "sampler=exact", "sampler.n_samples=512", "sampler.n_chains=8", "final_rounds=4", "n_iter=15"]


@pytest.fixture(scope="module")
def ising(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("api") / "ising"
    run_cli([*EXACT, f"hydra.run.dir={run_dir}"], REPO, check=True)
    return run_dir


@pytest.fixture(scope="module")
def heisenberg(tmp_path_factory):
    """A Heisenberg chain in the Sz=0 sector simulated after the Marshall rotation."""
    run_dir = tmp_path_factory.mktemp("api") / "heisenberg"
    run_cli([*EXACT, "hamiltonian=heisenberg", "hamiltonian.phase_prior=marshall", "hilbert.total_sz=0",
             f"hydra.run.dir={run_dir}"], REPO, check=True)
    return run_dir


def checkpoint_params(run_dir, model, n_sites):
    """The model's parameters read straight from the checkpoint file: its first leaves, in the
    order of the model's own parameter tree (independent of runner.lifecycle.load)."""
    like = model.init(jax.random.PRNGKey(0), jnp.ones((n_sites,), jnp.int8))["params"]
    leaves, treedef = jax.tree_util.tree_flatten(like)
    with np.load(run_dir / "checkpoint" / "state.npz") as data:
        return jax.tree_util.tree_unflatten(treedef, [data[f"leaf_{i:04d}"] for i in range(len(leaves))])


@pytest.mark.slow
def test_config_params_and_log_psi_are_the_checkpoint_model(ising):
    run = runner.load(ising)
    assert run.config["hilbert"]["L"] == 6 and run.config["sampler"]["_target_"] == "runner.core.sampler.exact"
    assert run.step == 15
    model = RBM(alpha=1, param_dtype=jnp.float64)
    params = checkpoint_params(ising, model, 6)
    states = all_states(run.hilbert)
    np.testing.assert_allclose(np.asarray(run.log_psi(states)), np.asarray(model.apply({"params": params}, states)),
                               rtol=0, atol=1e-12)
    batch = states[:12].reshape(3, 4, 6)  # any leading shape
    assert run.log_psi(batch).shape == (3, 4)
    with pytest.raises(ValueError, match=r"shape \[\.\.\., 6\]"):
        run.log_psi(np.ones((2, 5)))


def test_metrics_are_the_jsonl_as_a_dataframe(ising):
    run = runner.load(ising)
    rows = [json.loads(line) for line in (ising / "metrics.jsonl").read_text().splitlines()]
    frame = run.metrics
    assert list(frame["step"]) == list(range(15))
    np.testing.assert_array_equal(frame["energy"].to_numpy(), [r["energy"] for r in rows])


def test_expect_energy_agrees_with_the_summary(ising):
    run = runner.load(ising)
    summary = run.summary
    mean, error = run.expect("energy", n_samples=4096)
    assert abs(mean - summary["energy"]) < 4 * math.hypot(error, summary["energy_error"])


def test_expect_energy_evaluates_as_many_samples_at_once_as_a_step(ising):
    """expect(n) takes E_loc in blocks of the run's n_samples (memory of one step, not n / n_samples
    times more), the last block padded when they do not divide n: the same mean and error as E_loc
    of every sample at once."""
    from runner import api
    from runner.core import stats

    run = runner.load(ising)
    statistics = api._energy_statistics(run._problem)
    for T in (512, 500):  # 8 blocks of 64 samples per chain; 7 and a padded one
        sigma_CxTxN = np.asarray(run.sample(8 * T)).reshape(8, T, -1)
        blocked = statistics(run.params, sigma_CxTxN, None)
        whole = stats.statistics(jnp.asarray(run.local_energies(sigma_CxTxN.reshape(8 * T, -1)).reshape(8, T)),
                                 None, True)
        assert float(jnp.real(blocked.mean)) == pytest.approx(float(jnp.real(whole.mean)), rel=1e-12)
        assert float(blocked.error_of_mean) == pytest.approx(float(whole.error_of_mean), rel=1e-9)
    assert run._problem.sampler.n_samples == 512  # so blocks of 64 samples per chain


def exact_expectation(run, terms_on_sites, rotated_sites=()):
    """<psi|O|psi>/<psi|psi> with dense Kronecker products, psi in the user's basis: the model's
    amplitudes times prod_{i in rotated} s_i (undoing a Marshall rotation U = prod Z_i)."""
    states = all_states(run.hilbert)
    log_psi = np.asarray(run.log_psi(states)).astype(complex)
    for i in rotated_sites:
        log_psi = log_psi + np.where(states[:, i] < 0, 1j * np.pi, 0)
    psi = dense_psi(log_psi - log_psi.real.max(), states)
    O = dense_pauli(terms_on_sites, run.hilbert.n_sites)
    return float(np.real(np.vdot(psi, O @ psi) / np.vdot(psi, psi)))


def test_expect_pauli_terms_against_dense_sums(ising):
    run = runner.load(ising)
    bonds = [tuple(int(s) for s in b) for b in run.hilbert.bonds]
    terms = [{"coeff": 0.5, "ops": "XX", "on": "bonds"}, {"coeff": 1.0, "ops": "X", "on": "sites"},
             {"coeff": 0.3, "ops": "ZY", "on": [[0, 2]]}]
    dense_terms = ([(0.5, "XX", b) for b in bonds] + [(1.0, "X", (i,)) for i in range(6)]
                   + [(0.3, "ZY", (0, 2))])
    exact = exact_expectation(run, dense_terms)
    mean, error = run.expect(terms, n_samples=8192)
    assert abs(mean - exact) < 5 * error and error < 0.05 * abs(exact), (mean, error, exact)


@pytest.mark.slow
def test_expect_is_in_the_original_basis_after_a_sign_rule(heisenberg):
    """The model holds U psi (U = Marshall rotation); <X X> on a bond changes sign under U, so
    an expect without the rotation would give the opposite sign."""
    run = runner.load(heisenberg)
    rotated = run.hamiltonian.rotated
    assert rotated
    bonds = [tuple(int(s) for s in b) for b in run.hilbert.bonds]
    exact = exact_expectation(run, [(1.0, "XX", b) for b in bonds], rotated)
    mean, error = run.expect([{"coeff": 1.0, "ops": "XX", "on": "bonds"}], n_samples=8192)
    assert exact < -1 and abs(mean - exact) < 5 * error, (mean, error, exact)
    mx = run.expect("magnetization_x", n_samples=1024)  # leaves the Sz=0 sector: exactly 0
    assert mx.mean == pytest.approx(0.0, abs=1e-12)


def test_local_energies_and_peak_check_against_dense_sums(heisenberg):
    """E_loc = (H psi)(sigma) / psi(sigma) with H as simulated (after the sign rule), on every
    configuration; the peak check's largest |psi| is the largest of all of them."""
    from tests.helpers.dense import basis_index, dense_heisenberg

    run = runner.load(heisenberg)
    states = all_states(run.hilbert)
    log_psi = np.asarray(run.log_psi(states)).astype(complex)
    psi = dense_psi(log_psi - log_psi.real.max(), states)
    rotated = run.hamiltonian.rotated
    sublattice = [i in set(rotated) for i in range(6)]
    H = dense_heisenberg(run.hilbert.bonds, run.hilbert.next_bonds, 6, 1.0, 0.0, sublattice)
    rows = basis_index(states)
    np.testing.assert_allclose(run.local_energies(states), (H @ psi)[rows] / psi[rows], rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match=r"shape \[K, 6\]"):
        run.local_energies(states[None])
    check = run.peak_check(n_samples=512)
    assert check["method"] == "exhaustive" and not check["wrong"]
    np.testing.assert_allclose(check["found_log_abs_max"], log_psi.real.max(), rtol=1e-12)


def test_sample_draws_from_the_run_sampler(heisenberg):
    run = runner.load(heisenberg)
    sigma = run.sample(4096)
    assert sigma.shape == (4096, 6) and sigma.dtype == np.int8
    assert np.all(np.abs(sigma) == 1) and np.all(sigma.sum(axis=1) == 0)  # the Sz=0 sector
    # exact sampler: frequencies of the basis states against |psi|^2
    states = all_states(run.hilbert)
    p = np.exp(2 * np.real(np.asarray(run.log_psi(states))))
    p /= p.sum()
    codes = {tuple(s): k for k, s in enumerate(states)}
    counts = np.bincount([codes[tuple(s)] for s in sigma], minlength=len(states))
    expected = 4096 * p
    chi2 = float(np.sum((counts - expected) ** 2 / expected))
    assert chi2 < len(states) + 6 * math.sqrt(2 * len(states)), chi2
    with pytest.raises(ValueError, match="multiple of sampler.n_chains=8"):
        run.sample(100)


def test_a_run_directory_of_the_old_layout_loads():
    """Written at 6dc7890: old module paths in its `_target_`s, the retired `peak_restart_every: 0`
    (tests/lifecycle/test_load.py checks the pieces)."""
    trained = runner.load(REPO / "tests" / "integration" / "golden" / "run_6dc7890" / "run")
    assert trained.step == 10
    assert np.isfinite(trained.expect("magnetization_x", n_samples=256).mean)


def test_run_from_python_composes_runs_and_loads_like_the_cli(tmp_path, monkeypatch):
    """runner.run: the CLI's composition, run directory (outputs/<run id>) and code path, returning
    runner.load's TrainedRun; a bad config raises the CLI's sentence instead of exiting."""
    from runner import cli
    from runner.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli, "run_id", lambda: "api-run")
    small = ["hilbert.L=6", "sampler.n_samples=64", "sampler.n_chains=8", "n_iter=3", "final_rounds=1", "exact=false"]
    trained = runner.run(small)
    assert isinstance(trained, runner.api.TrainedRun) and trained.step == 3
    assert trained.run_dir == tmp_path / "outputs" / "api-run" or str(trained.run_dir) == "outputs/api-run"
    assert trained.config["hilbert"]["L"] == 6 and trained.summary["status"] == "completed"
    assert runner.load(tmp_path / "outputs" / "api-run").step == 3
    with pytest.raises(ConfigError) as typo:
        runner.run(["hilbert.LL=8"], run_dir=tmp_path / "typo")
    assert str(typo.value).startswith("hilbert.LL is not a key of hilbert=chain;")
    with pytest.raises(ConfigError, match="is not an option; choose one of"):
        runner.run(["model=nope"], run_dir=tmp_path / "option")
    with pytest.raises(ConfigError, match="n_iter"):
        runner.run([*small, "n_iter=-1"], run_dir=tmp_path / "value")
    assert not (tmp_path / "typo").exists() and not (tmp_path / "value").exists()
