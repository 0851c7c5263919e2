"""Layouts and processes: a function on n devices, a run on the first n devices of this process, one
VMC step on one device and on four, and runs of several JAX processes on this machine."""

import os
import socket
import subprocess
import sys

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from runner import app
from runner.parallel import mesh
from tests.helpers.cli import REPO


def on_devices(fn, n_devices, *args, mesh_in_context=False):
    """fn jitted with every argument's last axis (samples, chain-major) split over n devices,
    compiled under that mesh (`jax.set_mesh`) if asked."""
    mesh = Mesh(np.asarray(jax.devices()[:n_devices]), ("chains",))
    shardings = tuple(NamedSharding(mesh, PartitionSpec(*([None] * (a.ndim - 1)), "chains")) for a in args)
    if mesh_in_context:
        with jax.set_mesh(mesh):
            out = jax.jit(fn, in_shardings=shardings)(*args)
    else:
        out = jax.jit(fn, in_shardings=shardings)(*args)
    return jax.tree_util.tree_map(np.asarray, out)


def execute_on_devices(experiment, tmp_path, counts):
    """The run on the first n devices of one process for each n, into tmp_path/devices{n}."""
    devices = jax.devices()
    for n in counts:
        layout = mesh.Layout(jax.sharding.Mesh(np.asarray(devices[:n]), (mesh.CHAIN_AXIS,)))
        app.execute(experiment, layout, tmp_path / f"devices{n}")


def one_step_on_one_and_four_devices(problem, sigma_N):
    """((energy stats, update) of one step on one device, the same on four), from the samples of
    chains started at `sigma_N`, drawn once on one device."""
    from runner.core.sampler import sample
    from runner.core.vmc import energy_and_update, init_state
    from runner.parallel import mesh

    state = init_state(problem, 0, sigma_N)
    _, sigma_CxTxN, _ = jax.jit(lambda s: sample(problem.sampler, problem.amplitude, s.params, s.chains))(state)
    step = jax.jit(lambda p, s: energy_and_update(problem, p, s, state.solver)[:2])
    layout = mesh.make_mesh("sharded")
    sharded = jax.device_put(sigma_CxTxN, layout.chains)
    assert len(sharded.sharding.device_set) == 4
    return step(state.params, sigma_CxTxN), step(jax.device_put(state.params, layout.replicated), sharded)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_distributed(overrides, run_dir, port, n_proc=2, devices=2):
    procs = []
    for pid in range(n_proc):
        args = [sys.executable, "-m", "runner", *overrides, "parallel=distributed",
                f"parallel.coordinator_address=127.0.0.1:{port}", f"parallel.num_processes={n_proc}",
                f"parallel.process_id={pid}", f"parallel.cpu_devices={devices}",
                "parallel.init_timeout_s=60", f"hydra.run.dir={run_dir}"]
        procs.append(subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      env=UNCACHED))
    return procs


# Processes of one distributed run compile afresh: with the tests' persistent compilation cache
# (tests/conftest.py) filled by the suite, two CPU processes that load their programs from it can hang
# in their first collective (heis_complex_exchange_minsr, docs/notes/tests.md 2026-12-02).
UNCACHED = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}


def on_one_and_four_devices(fn, tree):
    """fn(tree) jitted under a mesh of 1 device and under one of 4 (`jax.set_mesh`, as the runner
    compiles), every leaf of `tree` under a `chains` field split over the devices and the others
    replicated (`runner.parallel.mesh.shard_state`): (the outputs on 1, on 4) as NumPy trees."""
    outs = []
    for n in (1, 4):
        layout = mesh.Layout(Mesh(np.asarray(jax.devices()[:n]), (mesh.CHAIN_AXIS,)))
        placed = jax.device_put(tree, mesh.shard_state(tree, layout))
        with jax.set_mesh(layout.mesh):
            outs.append(jax.tree_util.tree_map(np.asarray, jax.jit(fn)(placed)))
    return outs


def assert_same_bits(got, want):
    """Every leaf of two output trees bitwise equal (NaN where NaN), the trees alike."""
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for i, (a, b) in enumerate(zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want))):
        np.testing.assert_array_equal(a, b, err_msg=f"leaf {i}")
