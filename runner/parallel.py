"""The one place that knows about processes, devices and the mesh.

`initialize` sets process-level JAX flags and (for multi-process backends) is the only call of
`jax.distributed.initialize`; it must run before anything touches a device. `make_mesh` builds
a mesh with a single chain axis over every device of every process, and `Layout` holds the two
shardings the VMC core needs: per-chain and replicated.
"""

import dataclasses
import hashlib
import os
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from runner.errors import ConfigError, require_int

CHAIN_AXIS = "chains"
BACKENDS = ("single", "sharded", "distributed", "multinode")
# A dead peer is noticed by the coordination service after this many seconds without a
# heartbeat; the survivors then stop with an error instead of waiting in a collective.
HEARTBEAT_TIMEOUT_S = 10
PROXY_VARS = ("grpc_proxy", "https_proxy", "http_proxy", "GRPC_PROXY", "HTTPS_PROXY", "HTTP_PROXY")

_initialized: dict | None = None


class DistributedInitError(RuntimeError):
    """The processes of a multi-process run could not find each other."""


# XLA:CPU runs a while loop whose buffers stay under this many bytes as one compiled kernel
# instead of dispatching every operation of its body separately (default 1 kB). A Metropolis
# step on 16 chains is a few microseconds of arithmetic, so per-operation dispatch dominated
# it: with the limit raised, a 6x6 RBM step takes 1.8 us instead of 2.8 us.
SMALL_LOOP_BYTES = 8_000_000
# A convolution inside such a kernel runs through XLA's own emitted loops instead of its
# convolution library: a 6x6 CNN's Metropolis draw on 16 chains took 206 ms instead of 152, on
# 64 complex64 chains 3,300 ms instead of 353 (docs/benchmarks.md, "Loops with convolutions").
# XLA leaves a loop that contains a custom call out of that compilation, so a model with
# convolutions ties each of its evaluations to one (`outside_loop_kernels`).
# glibc malloc hands a freed block above its mmap threshold (128 kB, rising to at most 32 MB)
# back to the kernel, so every step's large buffers (local energies of all connected
# configurations, activations of the per-sample derivatives) are fresh pages that fault in
# again. Allocating from the heap only, and keeping up to 1 GiB of freed heap, reuses them:
# a 6 x 6 ViT bench step 0.379 s instead of 0.460 s, its peak memory 1,041 MB instead of 968
# (docs/benchmarks.md, "Deep models").
MALLOC_SETTINGS = {"MALLOC_MMAP_MAX_": 0, "MALLOC_TRIM_THRESHOLD_": 1 << 30}
_MALLOPT_PARAMS = {"MALLOC_MMAP_MAX_": -4, "MALLOC_TRIM_THRESHOLD_": -1}  # M_MMAP_MAX, M_TRIM_THRESHOLD


def configure_runtime():
    """Process settings the runner owns; effective only before JAX starts its backend.

    Keeps OpenBLAS (used by JAX's CPU LAPACK calls) from fighting XLA for the cores, lets
    XLA:CPU compile small loops (the Metropolis sweep) into single kernels, and keeps glibc from
    returning large buffers to the kernel (`MALLOC_SETTINGS`: set in this process by `mallopt`,
    and in the environment for the processes it starts). A user's own OPENBLAS_NUM_THREADS,
    `--xla_backend_extra_options` or MALLOC_ variables win.
    """
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    _tune_malloc()
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_backend_extra_options" not in flags:
        option = f"--xla_backend_extra_options=xla_cpu_small_while_loop_byte_threshold={SMALL_LOOP_BYTES}"
        os.environ["XLA_FLAGS"] = f"{flags} {option}".strip()


def outside_loop_kernels(value, anchor):
    """`value`, unchanged, tied to a LAPACK call that keeps XLA:CPU from compiling any loop
    around it into a single kernel (`SMALL_LOOP_BYTES`): such a loop stays operation by
    operation, its convolutions in XLA's convolution library. A no-op on other backends.

    Args:
        value: an array of batch shape B (e.g. log psi of configurations [*B, N]).
        anchor: an array of shape B that varies inside the loop (e.g. each configuration's
            first spin), so the call cannot be moved out of it; its values are only squared.

    Returns:
        `value`, bit for bit: the call is a Cholesky factor of 1 + a^2 >= 1 per element a of
        `anchor`, which is always positive, selecting `value` (NaN otherwise, never taken).
    """
    if jax.default_backend() != "cpu":
        return value
    a = jax.lax.stop_gradient(anchor).astype(np.float32)
    positive = jax.lax.linalg.cholesky((1 + a * a)[..., None, None])[..., 0, 0] > 0
    return jnp.where(positive, value, np.nan)


def _tune_malloc():
    """Applies the unset `MALLOC_SETTINGS` to this process (glibc only) and its environment; a
    variable already set was read by glibc when the process started."""
    import ctypes
    import platform

    unset = {k: v for k, v in MALLOC_SETTINGS.items() if k not in os.environ}
    if not unset or platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    for key, value in unset.items():
        if mallopt(_MALLOPT_PARAMS[key], value) == 1:
            os.environ[key] = str(value)


def _visible_gpus(env) -> list[int] | None:
    ids = [x for x in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if x.strip()]
    if len(ids) > 1 and all(x.strip().isdigit() for x in ids):
        return list(range(len(ids)))  # indices within the visible set
    return None


def detect_cluster(env=None) -> dict | None:
    """Multi-process settings from the launcher's environment, or None outside one.

    Recognises a SLURM step (srun), Open MPI (mpirun) and submitit's local executor (which
    JAX does not detect itself). For SLURM and Open MPI, JAX's own detection finds the
    coordinator; we add `local_device_ids` when a task sees several GPUs (JAX's SLURM
    detection would give it one).

    Returns:
        A dict of `jax.distributed.initialize` arguments (possibly empty: let JAX detect),
        with "launcher" naming what was found.
    """
    env = os.environ if env is None else env
    gpus = _visible_gpus(env)
    extra = {"local_device_ids": gpus} if gpus else {}
    if "SUBMITIT_LOCAL_JOB_ID" in env and "SUBMITIT_LOCAL_NTASKS" in env:
        port = submitit_local_port(env["SUBMITIT_LOCAL_JOB_ID"])
        return {
            "launcher": "submitit_local",
            "coordinator_address": f"127.0.0.1:{port}",
            "num_processes": int(env["SUBMITIT_LOCAL_NTASKS"]),
            "process_id": int(env["SUBMITIT_LOCAL_GLOBALID"]),
            **extra,
        }
    if "SLURM_JOB_ID" in env and "SLURM_STEP_NODELIST" in env and "SLURM_PROCID" in env:
        return {"launcher": "slurm", **extra}
    if "OMPI_COMM_WORLD_SIZE" in env and "OMPI_COMM_WORLD_RANK" in env:
        return {"launcher": "openmpi", **extra}
    return None


# The coordinator port of a submitit local job: every task derives the same one from the job
# id, below Linux's ephemeral range (32768-60999), where an outgoing connection may already
# hold it (seen in CI: "Failed to add port to server" on process 0, process 1 waiting).
LOCAL_PORT_RANGE = (20000, 32000)


def submitit_local_port(job_id: str) -> int:
    low, high = LOCAL_PORT_RANGE
    return low + int(hashlib.sha1(job_id.encode()).hexdigest(), 16) % (high - low)


def coordinator_host(parallel: dict, env=None) -> str | None:
    """The host every process connects to, when it can be known before joining."""
    env = os.environ if env is None else env
    if parallel.get("backend") == "distributed":
        return str(parallel.get("coordinator_address", "")).rpartition(":")[0] or None
    if parallel.get("backend") == "multinode":
        if "SUBMITIT_LOCAL_JOB_ID" in env:
            return "127.0.0.1"
        nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
        if nodes:  # JAX takes the first node: "node[01-04],x" -> "node01"
            first = nodes.split(",")[0]
            if "[" in first:
                prefix, _, rest = first.partition("[")
                first = prefix + rest.split("-")[0].split(",")[0].rstrip("]")
            return first
    return None


def bypass_proxy(host: str | None, env=None) -> None:
    """Adds the coordinator host to no_proxy/NO_PROXY when a proxy variable is set.

    gRPC honours http(s)_proxy but not wildcard no_proxy entries (`10.0.0.*`), so without
    this the coordinator connection goes to the proxy and hangs.
    """
    env = os.environ if env is None else env
    if not host or not any(env.get(v) for v in PROXY_VARS):
        return
    for var in ("no_proxy", "NO_PROXY"):
        entries = [e for e in env.get(var, "").split(",") if e]
        if host not in entries:
            env[var] = ",".join([*entries, host])


def _distributed_args(parallel: dict) -> dict:
    """`jax.distributed.initialize` arguments for the distributed and multinode backends."""
    if parallel["backend"] == "multinode":
        found = detect_cluster()
        if found is None:
            raise ConfigError(
                "parallel",
                "multinode found no SLURM step, Open MPI or submitit environment; start it with "
                "srun/mpirun or the slurm launcher, or use parallel=distributed with explicit addresses",
            )
        found.pop("launcher")
        return found
    address = parallel.get("coordinator_address")
    if not isinstance(address, str) or ":" not in address:
        raise ConfigError("coordinator_address", f"must be HOST:PORT (got {address!r})")
    n = require_int("num_processes", parallel.get("num_processes"), minimum=1)
    pid = require_int("process_id", parallel.get("process_id"), minimum=0)
    if pid >= n:
        raise ConfigError("process_id", f"must be below num_processes={n} (got {pid})")
    args = {"coordinator_address": address, "num_processes": n, "process_id": pid}
    if parallel.get("local_device_ids") is not None:
        args["local_device_ids"] = list(parallel["local_device_ids"])
    return args


def _join(args: dict, timeout: int) -> None:
    """`jax.distributed.initialize` under a watchdog.

    On a timeout JAX aborts the process with a C++ stack trace; our watchdog fires first
    (JAX gets a longer deadline) and exits with status 1 and one plain sentence.
    """
    where = args.get("coordinator_address", "the coordinator found in the environment")
    message = (
        f"Error: process {args.get('process_id', '?')} could not join the other processes at "
        f"{where} within {timeout} s. Check that every process was started with the same "
        "coordinator_address and num_processes, that the host name resolves and the port is "
        "reachable; `python -m runner.doctor` checks this setup.\n"
    )
    joined = threading.Event()

    def expire():
        if not joined.is_set():
            sys.stderr.write(message)
            sys.stderr.flush()
            os._exit(1)

    watchdog = threading.Timer(timeout, expire)
    watchdog.daemon = True
    watchdog.start()
    try:
        jax.distributed.initialize(
            **args,
            initialization_timeout=timeout + 30,
            heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_S,
            shutdown_timeout_seconds=30,
        )
    except Exception as err:  # JAX raises runtime errors of several types here
        raise DistributedInitError(f"{message.strip()} ({type(err).__name__}: {str(err)[:200]})") from None
    finally:
        joined.set()
        watchdog.cancel()


def initialize(parallel: dict, x64: bool) -> None:
    """Sets process-level flags and joins the other processes, once, before any array exists.

    Idempotent for equal arguments. The only call of `jax.distributed.initialize`.

    Args:
        parallel: the `parallel` config group as a plain dict (`backend` and its options).
        x64: enable 64-bit types (from the `dtype` group).
    """
    global _initialized
    request = {"parallel": dict(parallel), "x64": bool(x64)}
    if _initialized is not None:
        if _initialized != request:
            raise RuntimeError(f"parallel.initialize called again with {request}, was {_initialized}")
        return
    backend = parallel.get("backend")
    if backend not in BACKENDS:
        raise ConfigError("parallel.backend", f"must be one of {', '.join(BACKENDS)} (got {backend!r})")
    jax.config.update("jax_enable_x64", bool(x64))
    if parallel.get("cpu_devices") is not None:
        n = require_int("cpu_devices", parallel["cpu_devices"], minimum=1)
        jax.config.update("jax_num_cpu_devices", n)
    if backend in ("distributed", "multinode"):
        args = _distributed_args(parallel)
        bypass_proxy(coordinator_host(parallel))
        timeout = require_int("init_timeout_s", parallel.get("init_timeout_s", 120), minimum=1)
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        _join(args, timeout)
    _initialized = request


@dataclasses.dataclass(frozen=True)
class Layout:
    """The mesh and the two shardings of the global-view core."""

    mesh: Mesh

    @property
    def chains(self) -> NamedSharding:
        """Leading (chain) axis split over every device."""
        return NamedSharding(self.mesh, PartitionSpec(CHAIN_AXIS))

    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec())

    @property
    def n_devices(self) -> int:
        return self.mesh.devices.size


def make_mesh(backend: str) -> Layout:
    """A one-axis mesh: one device for `single`, every device otherwise.

    Built directly from `jax.devices()` (ordered by process, then device id) so that chain
    c always lands on the same global position whatever the number of processes.
    """
    devices = jax.devices()[:1] if backend == "single" else jax.devices()
    return Layout(Mesh(np.asarray(devices), (CHAIN_AXIS,)))


def check_chains(n_chains: int, layout: Layout) -> None:
    """Chains are split evenly over devices; refuse anything else instead of rounding."""
    if n_chains % layout.n_devices:
        raise ConfigError(
            "n_chains",
            f"must be a multiple of the {layout.n_devices} devices in use (got {n_chains})",
        )


def shard_state(tree, layout: Layout, chain_paths=("chains",)):
    """Shardings for a state pytree: leaves under a `chains` field per-chain, others replicated."""

    def pick(path, _):
        names = {getattr(k, "name", getattr(k, "key", None)) for k in path}
        return layout.chains if names & set(chain_paths) else layout.replicated

    return jax.tree_util.tree_map_with_path(pick, tree)


def to_host(tree):
    """NumPy copies of a pytree of global arrays, on every process.

    Replicated arrays are read from a local shard; sharded ones are gathered from every
    process (a collective: all processes must call this together).
    """
    from jax.experimental import multihost_utils

    def fetch(x):
        if not isinstance(x, jax.Array) or x.is_fully_addressable:
            return np.asarray(x)
        if x.is_fully_replicated:
            return np.asarray(x.addressable_data(0))
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))

    return jax.tree_util.tree_map(fetch, tree)


def from_host(tree, shardings):
    """Global arrays from NumPy values that every process holds in full (e.g. a checkpoint)."""

    def put(x, sharding):
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

    return jax.tree_util.tree_map(put, tree, shardings)
