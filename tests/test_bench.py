"""The benchmark's cases compose to the experiments they claim (one dtype each, sizes right)."""

import importlib.util

import pytest

from runner.build import build
from tests.conftest import REPO
from tests.test_config import compose_config

spec = importlib.util.spec_from_file_location("bench_run", REPO / "bench" / "run.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

EXPECTED = {  # case: (dtype, sites, samples, parameter count as in NetKet)
    "tfim1d": ("float64", 20, 1024, 440),
    "heis1d": ("complex128", 16, 1024, 560),
    "tfim2d": ("float64", 36, 2048, 1368),
}


@pytest.mark.parametrize("case", sorted(bench.CASES))
def test_bench_case_is_the_advertised_experiment(case):
    overrides = [*bench.CASES[case], *bench.COMMON]
    keys = [o.split("=")[0] for o in overrides]
    assert len(keys) == len(set(keys)), f"an override is given twice: {overrides}"
    config = compose_config(overrides)
    experiment = build(config)
    dtype, n_sites, n_samples, n_params = EXPECTED[case]
    assert experiment.dtype_name == dtype
    assert experiment.hilbert.n_sites == n_sites
    assert experiment.problem.sampler.n_samples == n_samples and experiment.problem.sampler.n_chains == 16
    import jax
    import jax.numpy as jnp

    params = experiment.problem.model.init(jax.random.PRNGKey(0), jnp.ones((n_sites,), jnp.int8))["params"]
    assert sum(x.size for x in jax.tree_util.tree_leaves(params)) == n_params
