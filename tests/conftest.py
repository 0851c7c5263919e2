"""Configures JAX before any computation: 4 fake CPU devices and 64-bit types."""

import os
import sys
from pathlib import Path

import pytest

from runner.parallel.runtime import configure_runtime  # noqa: E402  imports jax, starts no backend

configure_runtime()

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 4)
jax.config.update("jax_enable_x64", True)

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def repo():
    return REPO


def run_cli(args, cwd, timeout=300, env=None, check=False):
    """Runs `python -m runner ARGS` in a subprocess; returns CompletedProcess."""
    import subprocess

    full_env = {**os.environ, "HYDRA_FULL_ERROR": "0", **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "runner", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"runner failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc
