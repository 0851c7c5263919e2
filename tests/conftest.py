"""Configures JAX before any computation: 4 fake CPU devices and 64-bit types."""

import os
from pathlib import Path

import pytest

from tests.helpers.cache import cache_dir  # imports no jax

# A compilation cache for the runners the tests start (they inherit the environment): the many runs of
# the same few configs compile each program once. One directory per CPU model, CPU flags and jax/jaxlib
# version (tests.helpers.cache), so no process loads programs built for another machine. The size
# limit turns on JAX's file lock (no process reads a half-written entry) but scans the cache on every
# write, so the test processes themselves, whose programs are mostly each compiled once, keep the
# cache off (below).
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(cache_dir(Path(__file__).resolve().parent.parent / ".pytest_cache")))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.03")
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(2 << 30))

# LLVM at -O1 for every program the tests compile (the runners they start inherit it): the golden runs
# stay bit for bit (tests/integration/test_golden.py), compiling is faster and running no slower.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=1".strip()

from runner.parallel.runtime import configure_runtime  # noqa: E402  imports jax, starts no backend

configure_runtime()

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 4)
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_enable_compilation_cache", False)

from tests.helpers.cli import REPO  # noqa: E402
from tests.helpers.slurm import one_user  # noqa: E402


@pytest.fixture
def repo():
    return REPO


@pytest.fixture(autouse=True)
def one_slurm_test_at_a_time(request):
    """A test marked `slurm` has the local SLURM to itself (`tests.helpers.slurm.one_user`), taken before its own
    fixtures start their clocks (tests/integration/test_slurm.py's time limits)."""
    if request.node.get_closest_marker("slurm") is None:
        yield
        return
    with one_user():
        yield
