"""The VMC core: chunked evaluation equals unchunked and bounds memory; CG reports its work;
32-bit runs end to end; the final estimate pools its rounds."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from runner import app
from runner.config.build import build
from runner.core import local_energy, precond
from runner.core.estimate import estimate
from runner.core.jacobian import jacobian, log_derivatives
from runner.core.local_energy import NONZERO_BLOCKS, local_energies, nonzero_local_energies
from runner.core.sampler import sample
from runner.core.vmc import init_state, vmc_step
from runner.core.wavefunction import gradient_mode
from runner.parallel import mesh
from tests.helpers.cli import REPO, run_cli
from tests.helpers.config import compose_config

BASE = ["hilbert.L=8", "hilbert.total_sz=0", "hamiltonian=heisenberg", "sampler=metropolis_exchange",
        "dtype=complex128", "sampler.n_samples=256", "sampler.n_chains=8", "exact=false", "final_rounds=2"]


def _problem_and_samples(chunk_size=None):
    experiment = build(compose_config([*BASE, f"chunk_size={chunk_size or 'null'}"]))
    problem = experiment.problem
    state = init_state(problem, 0, jnp.ones((8,), jnp.int8))
    _, sigma, _ = sample(problem.sampler, problem.amplitude, state.params, state.chains)
    return problem, state, sigma


@pytest.mark.slow
def test_chunked_evaluation_equals_unchunked():
    whole, state, sigma = _problem_and_samples()
    chunked = dataclasses.replace(whole, chunk_size=64)  # 8 samples per chain at a time
    assert chunked.chunk_per_chain == 8
    np.testing.assert_allclose(local_energies(chunked, state.params, sigma),
                               local_energies(whole, state.params, sigma), rtol=1e-12)
    np.testing.assert_allclose(log_derivatives(chunked, state.params, sigma, "holomorphic"),
                               log_derivatives(whole, state.params, sigma, "holomorphic"), rtol=1e-12)


@pytest.mark.slow
def test_chunked_run_equals_unchunked_run(tmp_path):
    layout = mesh.make_mesh("single")
    plain = app.execute(build(compose_config([*BASE, "n_iter=5"])), layout, tmp_path / "plain")
    chunked = app.execute(build(compose_config([*BASE, "n_iter=5", "chunk_size=64"])), layout, tmp_path / "chunked")
    np.testing.assert_allclose(chunked["energy"], plain["energy"], rtol=1e-12)


def test_final_estimate_pools_rounds_as_longer_chains():
    problem, state, _ = _problem_and_samples()
    chains, one = jax.jit(lambda s: estimate(problem, s, n_rounds=1))(state)
    _, four = jax.jit(lambda s: estimate(problem, s, n_rounds=4))(state)
    # Four times the samples: the error shrinks by about two (allowing for tau and noise).
    assert 0.25 < four["energy_error"] / one["energy_error"] < 0.9
    assert abs(four["energy"] - one["energy"]) < 5 * one["energy_error"]


def _cg_problem_and_samples(model_overrides, chunk_size=None):
    experiment = build(compose_config(["hilbert.L=16", "sampler.n_samples=1024", "sampler.n_chains=16",
                                       "preconditioner.solver=cg", "exact=false", *model_overrides,
                                       f"chunk_size={chunk_size or 'null'}"]))
    problem = experiment.problem
    state = init_state(problem, 0, jnp.ones((16,), jnp.int8))
    _, sigma, _ = sample(problem.sampler, problem.amplitude, state.params, state.chains)
    return problem, state, sigma


# The RBM's own products, the generic jax.linearize path, and complex (holomorphic) parameters.
CG_MODELS = {"rbm": ["model.alpha=8"], "mlp": ["model=mlp", "model.hidden=[64]"],
             "rbm_complex": ["model.alpha=2", "dtype=complex128"]}


@pytest.mark.parametrize("name", sorted(CG_MODELS))
@pytest.mark.slow
def test_chunked_cg_products_and_step_equal_unchunked_and_use_less_memory(name):
    whole, state, sigma = _cg_problem_and_samples(CG_MODELS[name])
    chunked = dataclasses.replace(whole, chunk_size=64)  # 4 samples of each of the 16 chains at a time
    mode = gradient_mode(state.params, whole.model)
    v = ravel_pytree(state.params)[0] * 0.7 + 0.01
    w = jax.random.normal(jax.random.PRNGKey(1), (1024,))

    def products(problem):
        def f(params, sigma, v, w):
            jac = jacobian(problem, params, sigma, mode)
            return jac.matvec(v), jac.rmatvec(jac.to_samples(w)), jac.rmatvec(jac.matvec(v))
        return jax.jit(f)

    for a, b in zip(products(chunked)(state.params, sigma, v, w), products(whole)(state.params, sigma, v, w)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    # Memory: what a CG iteration's products hold at once shrinks with the chunk.
    temp = {p.chunk_size: products(p).lower(state.params, sigma, v, w).compile().memory_analysis().temp_size_in_bytes
            for p in (whole, chunked)}
    assert temp[64] < 0.75 * temp[None], temp
    # A whole step with CG. Its Krylov recurrence amplifies the products' last-bit differences
    # (the chunks' partial sums are added in another order than one sum over a chain) up to
    # the solve's tolerance, so CG solves tightly here to compare the steps themselves.
    tight = precond.sr(solver="cg", cg_tol=1e-12, cg_maxiter=5000)
    step = lambda problem: jax.jit(lambda s: vmc_step(dataclasses.replace(problem, precondition=tight), s))  # noqa: E731
    (new_c, metrics_c), (new_w, metrics_w) = step(chunked)(state), step(whole)(state)
    assert int(metrics_w["cg_iters"]) > 0
    for a, b in zip(jax.tree_util.tree_leaves(new_c.params), jax.tree_util.tree_leaves(new_w.params)):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(metrics_c["energy"], metrics_w["energy"], rtol=1e-12)


@pytest.mark.slow
def test_metrics_report_cg_work_only_for_cg():
    problem, state, _ = _cg_problem_and_samples(["model.alpha=1"])
    _, metrics = jax.jit(lambda s: vmc_step(problem, s))(state)
    assert int(metrics["cg_iters"]) >= 1 and 0 <= float(metrics["cg_residual"]) <= 1e-5
    dense = dataclasses.replace(problem, precondition=precond.sr(solver="cholesky"))
    _, metrics = jax.jit(lambda s: vmc_step(dense, s))(init_state(dense, 0, jnp.ones((16,), jnp.int8)))
    assert "cg_iters" not in metrics and "cg_residual" not in metrics


DTYPE_RUN = ["hilbert.L=8", "sampler.n_samples=512", "sampler.n_chains=16", "n_iter=60", "final_rounds=2",
             "exact=true", "checkpoint_every=1000"]


@pytest.mark.parametrize("overrides", [
    ["dtype=float32"],
    ["dtype=float32", "preconditioner.solver=cg"],
    ["dtype=complex64", "hamiltonian=heisenberg", "hilbert.total_sz=0", "sampler=metropolis_exchange",
     "preconditioner.solver=cg"],
], ids=["float32", "float32_cg", "complex64_heisenberg_cg"])
@pytest.mark.slow
def test_single_precision_runs_end_to_end(overrides, tmp_path):
    """32-bit runs from the command line finish near the exact energy, and CG converges at
    the dtype's default tolerance instead of running to cg_maxiter."""
    proc = run_cli([*DTYPE_RUN, *overrides, f"hydra.run.dir={tmp_path}"], REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert np.isfinite(summary["energy"]) and summary["relative_error"] < 0.02, summary
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(np.isfinite(r["energy"]) for r in records)
    if "preconditioner.solver=cg" in overrides:
        iters = [r["cg_iters"] for r in records]
        assert max(iters) < 1000 and all(r["cg_residual"] <= 1e-3 for r in records), iters
    else:
        assert all("cg_iters" not in r for r in records)


J1J2_CHAIN = ["hilbert=chain", "hilbert.L=8", "hilbert.total_sz=0", "hamiltonian=heisenberg", "hamiltonian.J2=0.5",
              "hamiltonian.phase_prior=marshall", "sampler=metropolis_exchange", "sampler.n_chains=7",
              "sampler.n_samples=70", "model=cnn", "model.channels=4", "dtype=float64", "exact=false"]


@pytest.mark.parametrize("chunk_size", [None, 14])
@pytest.mark.slow
def test_generic_local_energies_skip_zero_elements_and_match_dense(chunk_size):
    """A model without fast paths: E_loc of every Sz = 0 state equals (H psi)(s) / psi(s) of the
    dense J1-J2 matrix, while log psi is evaluated on the nonzero elements' configurations
    (plus at most one block of padding per chain and call), not on all K per sample."""
    from runner.physics import hilbert as hb
    from tests.helpers.dense import basis_index, dense_heisenberg, dense_psi

    problem = build(compose_config([*J1J2_CHAIN, f"chunk_size={chunk_size or 'null'}"])).problem
    assert problem.amplitude is not None and problem.model.__class__.__name__ == "CNN"
    lattice = problem.sampler.hilbert
    states = hb.all_states(lattice)  # the 70 Sz = 0 states, as 7 chains of 10
    params = init_state(problem, 0, jnp.ones((8,), jnp.int8)).params
    eloc = np.asarray(jax.jit(lambda s: local_energies(problem, params, s))(jnp.asarray(states.reshape(7, 10, 8))))
    H = dense_heisenberg(lattice.bonds, lattice.next_bonds, 8, 1.0, 0.5, lattice.sublattice)
    psi = dense_psi(problem.logpsi(params, jnp.asarray(states)), states)
    idx = basis_index(states)
    np.testing.assert_allclose(eloc.reshape(-1), (H @ psi)[idx] / psi[idx], rtol=1e-10, atol=1e-10)

    rows = []

    def counted(p, s):
        jax.debug.callback(lambda x: rows.append(int(np.prod(x.shape[:-1]))), s)
        return problem.logpsi(p, s)

    sigma = jnp.asarray(states.reshape(7, 10, 8))
    jax.block_until_ready(jax.jit(lambda s: nonzero_local_energies(problem.hamiltonian, counted, params, s))(sigma))
    K = problem.hamiltonian.n_connected
    n_nonzero = sum(int(np.sum(np.asarray(operators_connected(problem.hamiltonian, s)) != 0)) for s in states)
    evaluated = sum(rows) - 70  # minus the samples' own log psi
    block = -(-10 * K // NONZERO_BLOCKS)
    assert n_nonzero <= evaluated <= n_nonzero + 7 * block
    assert evaluated < 0.75 * 70 * K  # Sz = 0 on a chain with J2: many flips annihilate the state


def operators_connected(ham, sigma_N):
    return local_energy.connected(ham, jnp.asarray(sigma_N))[1]
