"""The VMC core: chunked evaluation equals unchunked; the final estimate pools its rounds."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from runner import app, parallel
from runner.build import build
from runner.sampler import sample
from runner.vmc import estimate, init_state, local_energies, log_derivatives
from tests.test_config import compose_config

BASE = ["hilbert.L=8", "hilbert.total_sz=0", "hamiltonian=heisenberg", "sampler=metropolis_exchange",
        "dtype=complex128", "sampler.n_samples=256", "sampler.n_chains=8", "exact=false", "final_rounds=2"]


def _problem_and_samples(chunk_size=None):
    experiment = build(compose_config([*BASE, f"chunk_size={chunk_size or 'null'}"]))
    problem = experiment.problem
    state = init_state(problem, 0, jnp.ones((8,), jnp.int8))
    _, sigma, _ = sample(problem.sampler, problem.amplitude, state.params, state.chains)
    return problem, state, sigma


def test_chunked_evaluation_equals_unchunked():
    whole, state, sigma = _problem_and_samples()
    chunked = dataclasses.replace(whole, chunk_size=64)  # 8 samples per chain at a time
    assert chunked.chunk_per_chain == 8
    np.testing.assert_allclose(local_energies(chunked, state.params, sigma),
                               local_energies(whole, state.params, sigma), rtol=1e-12)
    np.testing.assert_allclose(log_derivatives(chunked, state.params, sigma, "holomorphic"),
                               log_derivatives(whole, state.params, sigma, "holomorphic"), rtol=1e-12)


def test_chunked_run_equals_unchunked_run(tmp_path):
    layout = parallel.make_mesh("single")
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
