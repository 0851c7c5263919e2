"""Processes: cluster detection, the coordinator, proxies, and the one call of `jax.distributed.initialize`."""

import hashlib
import os
import sys
import threading

import jax
import numpy as np

from runner.errors import ConfigError, require_int

BACKENDS = ("single", "sharded", "distributed", "multinode")

# A dead peer is noticed by the coordination service after this many seconds without a
# heartbeat; the survivors then stop with an error instead of waiting in a collective.
HEARTBEAT_TIMEOUT_S = 10

PROXY_VARS = ("grpc_proxy", "https_proxy", "http_proxy", "GRPC_PROXY", "HTTPS_PROXY", "HTTP_PROXY")

_initialized: dict | None = None


class DistributedInitError(RuntimeError):
    """The processes of a multi-process run could not find each other."""


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


def process_count() -> int:
    """How many processes run this computation (1 unless joined by `initialize`)."""
    return jax.process_count()


def process_index() -> int:
    """This process's number, 0 to process_count() - 1."""
    return jax.process_index()


def is_main() -> bool:
    """Whether this is process 0, the one that writes a run's shared files."""
    return jax.process_index() == 0


def allgather(x_host):
    """Every process's `x_host` (a small NumPy array), stacked along a new leading axis."""
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(x_host)


def broadcast_object(x):
    """Process 0's `x` (any picklable value; ignored on the others) on every process: process 0
    computes what every process needs (an exact spectrum), the others receive it."""
    import pickle

    from jax.experimental import multihost_utils

    data = np.frombuffer(pickle.dumps(x), np.uint8) if is_main() else np.zeros(0, np.uint8)
    size = int(np.asarray(multihost_utils.broadcast_one_to_all(np.array([data.size], np.int32)))[0])
    padded = np.zeros(size, np.uint8)
    padded[:data.size] = data
    return pickle.loads(np.asarray(multihost_utils.broadcast_one_to_all(padded), np.uint8).tobytes())


def broadcast_float(x: float) -> float:
    """Process 0's `x` on every process, bit for bit (as two uint32 words: x64 may be off)."""
    from jax.experimental import multihost_utils

    words = np.frombuffer(np.float64(x).tobytes(), np.uint32)
    words = np.asarray(multihost_utils.broadcast_one_to_all(words), np.uint32)
    return float(np.frombuffer(words.tobytes(), np.float64)[0])
