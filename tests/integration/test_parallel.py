"""One core, many layouts: whole runs on 2 processes x 2 devices and on 1, 2, 4 devices agree with one
device, and a checkpoint resumes on another layout. Each program's 1-against-4-device bits:
tests/integration/test_programs_on_layouts.py."""

import json
import os
import platform
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from runner import app
from runner.config.build import build
from runner.core.jacobian import parameter_blocks
from runner.core.sr import CGState
from runner.core.vmc import init_state, vmc_step
from runner.parallel import distributed, mesh, runtime
from tests.helpers.cli import REPO, run_cli
from tests.helpers.config import compose_config
from tests.helpers.parallel import execute_on_devices, free_port, start_distributed
from tests.helpers.runs import assert_identical_runs, energies

# Each case covers a Hamiltonian, a real or complex model, a sampler and a preconditioner.
CASES = {
    "tfim_real_local_sr": ["hilbert.L=8", "model=rbm"],
    "heis_complex_exchange_minsr": [
        "hilbert.L=8", "hilbert.total_sz=0", "hamiltonian=heisenberg", "sampler=metropolis_exchange",
        "dtype=complex128", "preconditioner=minsr",
    ],
}
# minSR's whole runs are held to a relative 1e-10: its kernel and update differ in the last bit
# between 1 and 4 devices on some CPUs (a relative 2e-16 on an AMD EPYC), bitwise on others
# (docs/notes/layouts.md).
NOT_BITWISE_RTOL = 1e-10
COMMON = ["sampler.n_samples=256", "sampler.n_chains=8", "n_iter=8", "final_rounds=1", "exact=false"]


def test_checkpoint_resumes_on_another_layout(tmp_path):
    """Four sharded devices for 4 steps, then one device from the checkpoint = one device throughout."""
    import dataclasses

    experiment = build(compose_config([*CASES["heis_complex_exchange_minsr"], *COMMON, "checkpoint_every=100"]))
    short = dataclasses.replace(experiment, settings=dataclasses.replace(experiment.settings, n_iter=4))
    app.execute(short, mesh.make_mesh("sharded"), tmp_path / "moved")
    moved = app.execute(experiment, mesh.make_mesh("single"), tmp_path / "moved")
    straight = app.execute(experiment, mesh.make_mesh("single"), tmp_path / "straight")
    np.testing.assert_allclose(energies(tmp_path / "moved"), energies(tmp_path / "straight"), rtol=1e-10)
    np.testing.assert_allclose(moved["energy"], straight["energy"], rtol=1e-10)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tfim_real_local_sr", "heis_complex_exchange_minsr"])
def test_two_processes_match_single_device(name, tmp_path):
    overrides = [*CASES[name], *COMMON]
    run_cli([*overrides, f"hydra.run.dir={tmp_path / 'single'}"], REPO, check=True)
    procs = start_distributed(overrides, tmp_path / "dist", free_port())
    outputs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    summary = json.loads((tmp_path / "dist" / "summary.json").read_text())
    assert summary["processes"] == 2 and summary["devices"] == 4 and summary["backend"] == "distributed"
    np.testing.assert_allclose(energies(tmp_path / "dist"), energies(tmp_path / "single"), rtol=1e-10)


# The default solver above 500 parameters is CG (P = 560 here), whose Krylov recurrence turns
# any rounding difference into visibly different runs (1.7e-7 at step 2, -44.8040 against
# -44.8140 after 300 steps, before reductions were made layout-invariant). 14 steps include
# scheduled refreshes of CG's deflation basis (every 6 steps here, 20 by default).
LAYOUT_CASE = ["hilbert=square", "hilbert.L=4", "hilbert.total_sz=0", "hamiltonian=heisenberg",
               "sampler=metropolis_exchange", "dtype=complex128", "model.alpha=2", "sampler.n_samples=256",
               "sampler.n_chains=16", "n_iter=14", "preconditioner.cg_recycle_every=6", "final_rounds=1",
               "exact=false", "checkpoint_every=1000"]


@pytest.mark.slow
def test_default_solver_gives_bitwise_identical_runs_on_every_layout(tmp_path):
    """Same seed, same bits: energies of every step, the final checkpoint (parameters, chains,
    CG's warm start and deflation basis) and the final estimate, on 1, 2 and 4 devices of one
    process and on 2 processes."""
    experiment = build(compose_config(LAYOUT_CASE))
    assert isinstance(experiment.problem.precondition.init(jnp.zeros(560, jnp.complex128)), CGState)
    execute_on_devices(experiment, tmp_path, (1, 2, 4))
    records = [json.loads(line) for line in (tmp_path / "devices1" / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 14 and all(r["cg_iters"] > 0 for r in records)
    for n in (2, 4):
        assert_identical_runs(tmp_path / f"devices{n}", tmp_path / "devices1")
    procs = start_distributed(LAYOUT_CASE, tmp_path / "processes2", free_port(), devices=1)
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    summary = json.loads((tmp_path / "processes2" / "summary.json").read_text())
    assert summary["processes"] == 2 and summary["peak_check"]["method"] == "exhaustive"
    assert_identical_runs(tmp_path / "processes2", tmp_path / "devices1")


@pytest.mark.slow
def test_killed_peer_makes_the_other_exit(tmp_path):
    overrides = ["hilbert.L=12", "sampler.n_samples=512", "sampler.n_chains=8", "n_iter=100000",
                 "exact=false", "checkpoint_every=100000"]
    procs = start_distributed(overrides, tmp_path / "dist", free_port())
    metrics = tmp_path / "dist" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.exists() and len(metrics.read_text().splitlines()) > 3):
        time.sleep(0.2)
    assert metrics.exists(), procs[0].communicate(timeout=5)[0] if procs[0].poll() is not None else "no metrics"
    procs[1].send_signal(signal.SIGKILL)
    killed_at = time.time()
    try:
        out = procs[0].communicate(timeout=90)[0]
    except subprocess.TimeoutExpired:
        procs[0].kill()
        pytest.fail("process 0 hung after its peer died")
    assert procs[0].returncode != 0
    assert time.time() - killed_at < 60
    assert out  # it said something on its way out


@pytest.mark.slow
def test_missing_peer_times_out_with_a_clear_error(tmp_path):
    port = free_port()
    args = [sys.executable, "-m", "runner", "n_iter=2", "parallel=distributed",
            f"parallel.coordinator_address=127.0.0.1:{port}", "parallel.num_processes=2",
            "parallel.process_id=0", "parallel.init_timeout_s=5", f"hydra.run.dir={tmp_path}"]
    started = time.time()
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert time.time() - started < 60
    assert "could not join" in proc.stderr and "127.0.0.1" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "metrics.jsonl").exists()


def _sharded_inputs(name):
    experiment = build(compose_config([*CASES[name], *COMMON]))
    problem = experiment.problem
    sigma_N = jnp.ones((experiment.hilbert.n_sites,), jnp.int8)
    state = init_state(problem, 0, sigma_N)
    return problem, state


def test_output_shardings_of_the_step():
    problem, _ = _sharded_inputs("tfim_real_local_sr")
    layout = mesh.make_mesh("sharded")
    sigma_N = jnp.ones((8,), jnp.int8)
    init = lambda: init_state(problem, 0, sigma_N)  # noqa: E731
    shardings = mesh.shard_state(jax.eval_shape(init), layout)
    state = jax.jit(init, out_shardings=shardings)()
    step = jax.jit(lambda s: vmc_step(problem, s), in_shardings=(shardings,),
                   out_shardings=(shardings, layout.replicated))
    new_state, metrics = step(state)
    assert new_state.chains.sigma_CxN.sharding.spec == PartitionSpec(mesh.CHAIN_AXIS)
    assert new_state.chains.key_C.sharding.spec == PartitionSpec(mesh.CHAIN_AXIS)
    for leaf in jax.tree_util.tree_leaves(new_state.params) + jax.tree_util.tree_leaves(metrics):
        assert leaf.sharding.is_fully_replicated
    # Without explicit out_shardings the partitioner keeps chains split and parameters whole.
    free = jax.jit(lambda s: vmc_step(problem, s))(state)[0]
    assert free.chains.sigma_CxN.sharding.spec[0] == mesh.CHAIN_AXIS
    assert all(x.sharding.is_fully_replicated for x in jax.tree_util.tree_leaves(free.params))


def test_chain_count_must_divide_devices():
    from runner.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        mesh.check_chains(6, mesh.make_mesh("sharded"))
    assert "n_chains" in info.value.sentence() and "4 devices" in info.value.sentence()


def test_detect_cluster_from_environment():
    assert distributed.detect_cluster({}) is None
    found = distributed.detect_cluster({"SUBMITIT_LOCAL_JOB_ID": "77", "SUBMITIT_LOCAL_NTASKS": "3",
                                     "SUBMITIT_LOCAL_GLOBALID": "2"})
    assert found["num_processes"] == 3 and found["process_id"] == 2
    assert found["coordinator_address"].startswith("127.0.0.1:")
    # Ports below the ephemeral range, where no outgoing connection can hold them.
    ports = {distributed.submitit_local_port(str(job)) for job in range(2000)}
    assert min(ports) >= 20000 and max(ports) < 32768 and len(ports) > 1500
    slurm = {"SLURM_JOB_ID": "5", "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_PROCID": "0",
             "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    assert distributed.detect_cluster(slurm) == {"launcher": "slurm", "local_device_ids": [0, 1, 2, 3]}
    assert distributed.detect_cluster({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1"})["launcher"] == "openmpi"


# minSR with its kernel in 4 chunks and SPRING's momentum, P = 296 complex parameters > 128 samples.
MINSR_LAYOUT_CASE = ["hilbert.L=8", "hilbert.total_sz=0", "hamiltonian=heisenberg", "sampler=metropolis_exchange",
                     "dtype=complex128", "model.alpha=4", "preconditioner=minsr", "preconditioner.momentum=0.9",
                     "chunk_size=32", "sampler.n_samples=128", "sampler.n_chains=8", "n_iter=10", "final_rounds=1",
                     "exact=false", "checkpoint_every=1000"]


# The same without momentum, with a trust region small enough to cap every step, and the kernel
# summed over three blocks of parameters (hidden biases 32, weights 256, visible biases 8).
MINSR_CAPPED_CASE = [*MINSR_LAYOUT_CASE[:7], "preconditioner.max_norm=0.5", "preconditioner.param_chunk_size=64",
                     *MINSR_LAYOUT_CASE[8:]]


@pytest.mark.slow
@pytest.mark.parametrize("case", [MINSR_LAYOUT_CASE, MINSR_CAPPED_CASE], ids=["spring", "capped"])
def test_chunked_minsr_gives_the_same_runs_on_every_layout(tmp_path, case):
    """minSR's kernel from chunks gathered one at a time, its solve and SPRING's state, or its
    step capped by max_norm with the kernel summed over parameter blocks: the same runs on 1, 2
    and 4 devices of one process and on 2 processes (energies, the final checkpoint with the
    previous update, the final estimate), to the last bits (`NOT_BITWISE_RTOL`)."""
    experiment = build(compose_config(case))
    if case is MINSR_CAPPED_CASE:
        params = jax.eval_shape(lambda: init_state(experiment.problem, 0, jnp.ones(8, jnp.int8))).params
        assert parameter_blocks(params, 64) == [(0, 1), (1, 2), (2, 3)]
    execute_on_devices(experiment, tmp_path, (1, 2, 4))
    if case is MINSR_CAPPED_CASE:
        norms = [json.loads(line)["step_norm"] for line in (tmp_path / "devices1" / "metrics.jsonl").open()]
        assert min(norms) > 0.5, norms  # the cap binds on every step
    for n in (2, 4):
        assert_identical_runs(tmp_path / f"devices{n}", tmp_path / "devices1", rtol=NOT_BITWISE_RTOL)
    procs = start_distributed(case, tmp_path / "processes2", free_port(), devices=1)
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert json.loads((tmp_path / "processes2" / "summary.json").read_text())["processes"] == 2
    assert_identical_runs(tmp_path / "processes2", tmp_path / "devices1", rtol=NOT_BITWISE_RTOL)


@pytest.mark.parametrize("chunk_size", [None, 32])
def test_minsr_under_a_mesh_never_gathers_the_whole_jacobian(chunk_size):
    """Compiled on 4 devices under the mesh, minSR's largest all-gather is one chunk of Obar
    (chunk_size x P; without chunk_size a quarter of the samples), never all N_s x P."""
    import dataclasses
    import re

    from runner.core.jacobian import jacobian

    experiment = build(compose_config(["hilbert.L=12", "model.alpha=4", "preconditioner=minsr",
                                       "sampler.n_samples=256", "sampler.n_chains=16", "exact=false"]))
    problem = dataclasses.replace(experiment.problem, chunk_size=chunk_size)
    params = jax.eval_shape(lambda: init_state(problem, 0, jnp.ones((12,), jnp.int8))).params
    n_params = sum(x.size for x in jax.tree_util.tree_leaves(params))
    layout = mesh.make_mesh("sharded")
    sigma = jax.ShapeDtypeStruct((16, 16, 12), jnp.int8, sharding=layout.chains)
    eps = jax.ShapeDtypeStruct((256,), jnp.float64, sharding=jax.sharding.NamedSharding(
        layout.mesh, PartitionSpec(mesh.CHAIN_AXIS)))
    solve = jax.jit(lambda p, s, e: problem.precondition(jacobian(problem, p, s, "real"), e, "real"))
    with jax.set_mesh(layout.mesh):
        hlo = solve.lower(params, sigma, eps).compile().as_text()
    gathered = [np.prod([int(d) for d in dims.split(",") if d])
                for dims in re.findall(r"= f64\[([\d,]*)\]\S* all-gather", hlo)]
    assert gathered and max(gathered) == (chunk_size or 64) * n_params


_MMAPPED_BLOCKS = """
import ctypes, json, os
from runner.parallel.runtime import configure_runtime
configure_runtime()

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.mallinfo2.restype = MallInfo2
before = libc.mallinfo2().hblks
block = libc.malloc(64 << 20)
mmapped = libc.mallinfo2().hblks - before
libc.free(block)
print(json.dumps({"mmapped": mmapped, "env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}}))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc settings")
def test_the_runtime_keeps_large_buffers_in_the_heap():
    """configure_runtime makes glibc serve a 64 MB block from the heap (not a fresh mmap, whose
    pages would fault in again every step) and passes the settings on to child processes; a
    user's own MALLOC_ variable wins."""
    import ctypes

    if not hasattr(ctypes.CDLL(None), "mallinfo2"):
        pytest.skip("glibc < 2.33 has no mallinfo2")

    def run(**env):
        base = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
        out = subprocess.run([sys.executable, "-c", _MMAPPED_BLOCKS], env={**base, **env}, capture_output=True,
                             text=True, check=True, cwd=REPO)
        return json.loads(out.stdout.strip().splitlines()[-1])

    tuned = run()
    assert tuned["mmapped"] == 0
    assert tuned["env"] == {k: str(v) for k, v in runtime.MALLOC_SETTINGS.items()}
    users = run(MALLOC_MMAP_MAX_="65536", MALLOC_TRIM_THRESHOLD_="131072")
    assert users["mmapped"] == 1 and users["env"] == {"MALLOC_MMAP_MAX_": "65536", "MALLOC_TRIM_THRESHOLD_": "131072"}
