"""Automatic chunks from the memory budget: the estimate against XLA's own account of the memory,
the chunks it picks, and the recipes that needed them (issue 56 item 6)."""

import jax
import jax.numpy as jnp
import pytest

from runner.config.build import build
from runner.core import memory
from tests.helpers.config import compose_config


@pytest.mark.parametrize("n_samples,n_chains,per_sample,budget,expected", [
    (1024, 16, 1000, 2e6, None),  # 1.0e6 bytes fit at once
    (1024, 16, 1000, 1e6, 512),  # the largest multiple of 16 dividing 64 per chain evenly: 32 per chain
    (1024, 16, 1000, 5e5, 256),  # 31 per chain would fit; 16 is the largest divisor of 64 below
    (1024, 16, 1000, 10, 16),  # nothing fits: one sample per chain
    (96, 16, 1000, 5e4, 48),  # 6 per chain: 3 fits, the largest divisor of 6 at most 3
])
def test_chunk_for_is_the_largest_chunk_that_fits_and_divides_the_chains(n_samples, n_chains, per_sample, budget,
                                                                           expected):
    chunk = memory.chunk_for(n_samples, n_chains, per_sample, budget)
    assert chunk == expected
    if chunk is not None:
        assert chunk % n_chains == 0 and (n_samples // n_chains) % (chunk // n_chains) == 0


MODELS = [["model=rbm"], ["model=jastrow"], ["model=mlp"],
          ["hilbert=square", "hilbert.L=4", "model=rbm_symm"], ["hilbert=square", "hilbert.L=4", "model=cnn"],
          ["hilbert=square", "hilbert.L=4", "model=gcnn"], ["hilbert=square", "hilbert.L=4", "model=vit"]]


@pytest.mark.parametrize("overrides", MODELS, ids=lambda o: o[-1])
def test_the_estimate_follows_what_xla_holds_for_a_batch(overrides):
    """The numbers log psi holds per configuration, read from its jaxpr, against the temporary
    memory XLA compiles the evaluation of 512 configurations with (per configuration): within a
    factor of 4 either way for every model family."""
    problem = build(compose_config([*overrides, "memory_budget=null", "dtype=complex128"])).problem
    n = problem.hamiltonian.n_sites
    params = problem.model.init(jax.random.PRNGKey(0), jnp.ones((1, n), jnp.int8))["params"]
    batch = 512
    compiled = jax.jit(lambda p, s: problem.model.apply({"params": p}, s)).lower(
        params, jnp.ones((batch, n), jnp.int8)).compile()
    held = compiled.memory_analysis().temp_size_in_bytes / (batch * jnp.dtype(jnp.complex128).itemsize)
    forward, gradient = memory.model_sizes(problem.model, n)
    assert held / 4 <= forward <= 4 * max(held, n), (forward, held)
    assert gradient >= forward


@pytest.mark.parametrize("experiment", ["j1j2_square_excited", "j1j2_square_sector"])
def test_recipes_that_needed_gigabytes_are_chunked_by_default(experiment):
    """These recipes took 8 to 14.5 GB before memory_budget (docs/notes/memory.md); by default
    their batches go in chunks whose estimate fits the budget, the same chunks on every layout
    (the chunk is a function of the config alone), and memory_budget=null turns it off."""
    experiment_ = build(compose_config([f"experiment={experiment}"]))
    problem, settings = experiment_.problem, experiment_.settings
    assert problem.chunk_size is not None and problem.chunk_size < problem.sampler.n_samples
    assert settings.chunk_size == problem.chunk_size == settings.fingerprint["chunk_size"]
    ham = problem.hamiltonian
    per_sample = memory.bytes_per_sample(problem.model, ham.n_sites, ham.n_connected, 16)
    assert problem.chunk_size * per_sample <= settings.memory_budget * memory.GIB
    sharded = build(compose_config([f"experiment={experiment}", "parallel=sharded"]))
    assert sharded.problem.chunk_size == problem.chunk_size
    assert build(compose_config([f"experiment={experiment}", "memory_budget=null"])).problem.chunk_size is None
    explicit = build(compose_config([f"experiment={experiment}", f"chunk_size={problem.sampler.n_chains}"]))
    assert explicit.problem.chunk_size == problem.sampler.n_chains


def test_a_batch_that_fits_keeps_the_fingerprint_of_runs_before_the_budget():
    """No chunk when the batch fits: the fingerprint holds chunk_size null and no memory_budget,
    as runs written before the key existed do, so they resume."""
    settings = build(compose_config(["experiment=heis1d"])).settings
    assert settings.chunk_size is None and settings.fingerprint["chunk_size"] is None
    assert "memory_budget" not in settings.fingerprint


def test_a_bad_budget_is_one_sentence():
    from runner.errors import ConfigError

    with pytest.raises(ConfigError, match="memory_budget"):
        build(compose_config(["memory_budget=-1"]))


def test_the_estimate_does_not_follow_the_x64_flag():
    """The CLI builds before x64 is set, tests and API callers after: the model's sizes, so the
    automatic chunk and the fingerprint, are the same either way (the 4x4 CNN's were 608 and 960)."""
    model = build(compose_config(["hilbert=square", "hilbert.L=4", "model=cnn", "dtype=complex128"])).problem.model
    found = []
    for x64 in (True, False):
        memory._SIZES.clear()
        with jax.enable_x64(x64):
            found.append(memory.model_sizes(model, 16))
    assert found[0] == found[1]
