"""Training samples of |psi|^p reweighted by |psi|^(2-p) (`sampler.machine_pow`): the weights,
statistics with honest error bars, the energy and force against dense sums, estimates that
still sample |psi|^2, the same bits on every layout, and the refusals."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from runner import app
from runner.config.build import build
from runner.core import precond, stats
from runner.core import sampler as smp
from runner.core.estimate import BURN_IN_SWEEPS, burn_in, estimate, final_burn_in
from runner.core.problem import Problem, VMCState, draw
from runner.core.vmc import energy_and_update
from runner.errors import ConfigError
from runner.parallel import mesh
from tests.helpers.cli import REPO, run_cli
from tests.helpers.config import compose_config
from tests.helpers.exact import exact_setup, exact_weighted
from tests.helpers.parallel import free_port, start_distributed
from tests.helpers.runs import assert_identical_runs


def test_equal_weights_give_the_plain_statistics():
    x = jax.random.normal(jax.random.PRNGKey(0), (8, 64)) + 0.3j * jax.random.normal(jax.random.PRNGKey(1), (8, 64))
    x = x + 0.5 * jnp.cumsum(x, axis=1) / jnp.arange(1, 65)  # correlated along each chain
    plain = stats.statistics(x)
    weighted = stats.statistics(x, jnp.full(x.shape, 1.0 / x.size))
    for got, want in zip(weighted, plain):
        np.testing.assert_allclose(got, want, rtol=1e-12)
    assert stats.effective_sample_fraction(jnp.full(x.shape, 1.0 / x.size)) == pytest.approx(1.0)


def _problem(machine_pow, n_samples, seed=2, model="rbm_real"):
    """A real RBM (E_loc real: the error bar of the energy is its real part's)."""
    lattice, ham, model, states, params, H = exact_setup(model, seed=seed)
    sampler = smp.exact(lattice, n_samples=n_samples, n_chains=16, machine_pow=machine_pow)
    return Problem(ham, model, sampler, optax.sgd(0.1), precond.none()), params, states


def test_weights_are_psi_to_the_two_minus_p():
    problem, params, states = _problem(1.0, 256)
    _, sigma, w, _ = jax.jit(lambda c: draw(problem, params, c))(smp.init_chains(problem.sampler, 0))
    log_abs = np.real(np.asarray(problem.logpsi(params, sigma)))
    expected = np.exp(log_abs - log_abs.max())
    np.testing.assert_allclose(np.asarray(w), expected / expected.sum(), rtol=1e-12)
    assert float(np.sum(w)) == pytest.approx(1.0, rel=1e-14)


@pytest.mark.parametrize("machine_pow", [1.0, 0.5])
def test_reweighted_energy_and_force_are_unbiased_with_honest_error_bars(machine_pow):
    """Independent draws of |psi|^p (exact sampler) from 24 seeds: the reweighted energy and force
    scatter around the dense <psi|H|psi> and 2 <Obar* eps> within their error bars, and the
    energy's error bar is the seeds' actual spread."""
    problem, params, states = _problem(machine_pow, 1024)
    Obar, eps, E = (np.asarray(x) for x in exact_weighted(problem, params, states, "real"))
    force = 2 * (Obar.conj().T @ eps).real
    solver = problem.precondition.init(jnp.zeros(1))

    @jax.jit
    def one(chains):
        _, sigma, w, _ = draw(problem, params, chains)
        energy, grad, _, _ = energy_and_update(problem, params, sigma, solver, 0, w)
        return energy, jax.flatten_util.ravel_pytree(grad)[0], stats.effective_sample_fraction(w)

    out = [one(smp.init_chains(problem.sampler, seed)) for seed in range(24)]
    means = np.array([float(np.real(s.mean)) for s, _, _ in out])
    errors = np.array([float(s.error_of_mean) for s, _, _ in out])
    forces = np.stack([np.asarray(g) for _, g, _ in out])
    assert 0.3 < min(f for _, _, f in out) < 1.0  # reweighting costs samples, but not most of them
    assert abs(means.mean() - float(np.real(E))) < 4 * errors.mean() / np.sqrt(len(means))
    assert 0.6 < means.std(ddof=1) / errors.mean() < 1.5
    force_error = forces.std(axis=0, ddof=1) / np.sqrt(len(forces))
    assert np.all(np.abs(forces.mean(axis=0) - force) < 5 * force_error + 1e-12)


def test_estimates_sample_psi_squared_whatever_the_training_power():
    """The final estimate (and evaluation, the Python API) draws from |psi|^2: the same bits with
    machine_pow 1 as with 2."""
    out = []
    for machine_pow in (1.0, 2.0):
        problem, params, _ = _problem(machine_pow, 512)
        state = VMCState(params, None, smp.init_chains(problem.sampler, 0), jnp.zeros((), jnp.int32), None)
        out.append(jax.jit(lambda s: estimate(problem, s, 2)[1])(state))
    for key in out[0]:
        np.testing.assert_array_equal(out[0][key], out[1][key], err_msg=key)


def test_burn_in_takes_chains_from_anywhere_to_psi_squared():
    """`estimate.burn_in`: 8,192 chains started in the least likely configuration are, after
    `BURN_IN_SWEEPS` sweeps, distributed as the dense |psi|^2 (total variation within sampling
    noise); with 0 sweeps, and for a sampler without chains, nothing moves."""
    lattice, ham, model, states, params, _ = exact_setup("rbm_real", seed=2)
    p = np.exp(2 * np.real(np.asarray(model.apply({"params": params}, states))))
    p /= p.sum()
    sampler = smp.metropolis_local(lattice, n_samples=16384, n_chains=8192)
    problem = Problem(ham, model, sampler, optax.sgd(0.1), precond.none())
    chains = smp.init_chains(sampler, 0)
    chains = chains._replace(sigma_CxN=jnp.broadcast_to(states[np.argmin(p)], chains.sigma_CxN.shape))
    state = VMCState(params, None, chains, jnp.zeros((), jnp.int32), None)

    def total_variation(sigma_CxN):
        index = ((np.asarray(sigma_CxN) < 0) * 2 ** np.arange(lattice.n_sites)[::-1]).sum(axis=1)
        codes = ((np.asarray(states) < 0) * 2 ** np.arange(lattice.n_sites)[::-1]).sum(axis=1)
        counts = np.array([np.sum(index == c) for c in codes]) / len(index)
        return 0.5 * np.abs(counts - p).sum()

    burnt = jax.jit(lambda s: burn_in(problem, s, BURN_IN_SWEEPS))(state)
    assert total_variation(state.chains.sigma_CxN) > 0.9
    assert total_variation(burnt.chains.sigma_CxN) < 0.05  # the noise of 8,192 draws: about 0.03
    assert burn_in(problem, state, 0) is state
    exact_problem = Problem(ham, model, smp.exact(lattice, n_samples=16384, n_chains=8192), optax.sgd(0.1),
                            precond.none())
    assert burn_in(exact_problem, state, BURN_IN_SWEEPS) is state


def test_final_burn_in_only_after_training_on_another_power():
    lattice = exact_setup("rbm_real")[0]
    assert final_burn_in(smp.metropolis_local(lattice, machine_pow=2)) == 0
    assert final_burn_in(smp.metropolis_local(lattice, machine_pow=1)) == BURN_IN_SWEEPS
    assert final_burn_in(smp.exact(lattice, machine_pow=1)) == 0  # independent draws: no chains to burn in


def _metrics(run_dir):
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in line.items() if k != "wall_time"} for line in lines]


@pytest.mark.slow
def test_a_reweighted_run_is_identical_on_every_layout(tmp_path):
    """J1-J2 on a 12-site chain, Metropolis of |psi|^1 reweighted, observables measured during
    training on the weighted samples: 1 and 4 devices and 2 processes give the same bits
    (every metric of every step, the checkpoint, the final estimate)."""
    overrides = ["hilbert.L=12", "hilbert.total_sz=0", "hamiltonian=heisenberg", "hamiltonian.J2=0.5",
                 "hamiltonian.phase_prior=marshall", "model=rbm_symm", "model.group=lattice", "dtype=complex128",
                 "sampler=metropolis_exchange", "sampler.machine_pow=1", "sampler.n_samples=256", "sampler.n_chains=8",
                 "observables=spin", "observables.every=2", "n_iter=6", "checkpoint_every=1000"]
    experiment = build(compose_config(overrides))
    devices = jax.devices()
    for n in (1, 4):
        layout = mesh.Layout(jax.sharding.Mesh(np.asarray(devices[:n]), (mesh.CHAIN_AXIS,)))
        app.execute(experiment, layout, tmp_path / f"devices{n}")
    reference = _metrics(tmp_path / "devices1")
    assert all(0.2 < m["ess_fraction"] < 1 for m in reference) and "obs/zz_nn" in reference[0]
    assert _metrics(tmp_path / "devices4") == reference
    assert_identical_runs(tmp_path / "devices4", tmp_path / "devices1")
    procs = start_distributed(overrides, tmp_path / "processes2", free_port(), devices=1)
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert _metrics(tmp_path / "processes2") == reference
    assert_identical_runs(tmp_path / "processes2", tmp_path / "devices1")


@pytest.mark.parametrize("override,key,message", [
    (["sampler.machine_pow=3"], "sampler.machine_pow", "must be at most 2"),
    (["sampler.machine_pow=0"], "sampler.machine_pow", "must be a positive number"),
    (["sampler.machine_pow=1", "preconditioner=minsr", "preconditioner.momentum=0.9"], "preconditioner.momentum",
     "SPRING assumes equally weighted samples"),
])
def test_refused_at_build(override, key, message):
    with pytest.raises(ConfigError, match=message) as err:
        build(compose_config(["hilbert.L=6", *override]))
    assert err.value.key == key


def test_a_bad_power_exits_2_in_one_sentence(tmp_path):
    result = run_cli(["sampler.machine_pow=2.5", "n_iter=2", f"hydra.run.dir={tmp_path}"], REPO)
    assert result.returncode == 2
    assert "Config error: sampler.machine_pow must be at most 2 (got 2.5)" in result.stderr
    assert not (tmp_path / "metrics.jsonl").exists()
