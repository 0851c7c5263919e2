"""The one place that knows about processes, devices and the mesh.

`initialize` sets process-level JAX flags and (for multi-process backends) is the only call of
`jax.distributed.initialize`; it must run before anything touches a device. `make_mesh` builds
a mesh with a single chain axis over every device of every process, and `Layout` holds the two
shardings the VMC core needs: per-chain and replicated.
"""

import dataclasses
import os

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from runner.errors import ConfigError, require_int

CHAIN_AXIS = "chains"
BACKENDS = ("single", "sharded")

_initialized: dict | None = None


def configure_threads():
    """Keeps OpenBLAS (used by JAX's CPU LAPACK calls) from fighting XLA for the cores.

    Only takes effect before NumPy/SciPy load OpenBLAS; a user's own setting wins.
    """
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def initialize(parallel: dict, x64: bool) -> None:
    """Sets process-level flags once, before any array exists. Idempotent for equal arguments.

    Args:
        parallel: the `parallel` config group as a plain dict (`backend`, options).
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
        raise ConfigError("backend", f"must be one of {', '.join(BACKENDS)} (got {backend!r})")
    jax.config.update("jax_enable_x64", bool(x64))
    if backend == "sharded" and parallel.get("cpu_devices") is not None:
        n = require_int("cpu_devices", parallel["cpu_devices"], minimum=1)
        jax.config.update("jax_num_cpu_devices", n)
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
