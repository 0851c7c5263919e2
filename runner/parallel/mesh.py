"""The mesh: one chain axis over every device of every process, its two shardings, and placing state on it."""

import dataclasses

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from runner.errors import ConfigError

CHAIN_AXIS = "chains"


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


def device_ids(layout: Layout) -> tuple:
    """The ids of the layout's devices in mesh order (with a program's text, what its executable is for)."""
    return tuple(int(d.id) for d in np.ravel(layout.mesh.devices))


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


def shard_by_rank(tree, layout: Layout):
    """Shardings for a pytree of per-chain arrays and scalars (a step's samples,
    `runner.core.problem.draw`): a leaf with a leading chain axis split over devices, a scalar
    replicated."""
    return jax.tree_util.tree_map(lambda x: layout.chains if x.ndim else layout.replicated, tree)


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


def activate(layout: Layout):
    """The context in which code is traced and run under the layout's mesh."""
    return jax.set_mesh(layout.mesh)


# --- sharding constraints for code traced under a mesh (`jax.set_mesh`); no-ops without one ---


def meshed() -> bool:
    """Whether the caller is being traced under a mesh."""
    return not jax.sharding.get_abstract_mesh().empty


def replicated(x):
    """x whole on every device when traced under a mesh; x itself without one."""
    return jax.lax.with_sharding_constraint(x, PartitionSpec()) if meshed() else x


def spread_over_chains(x):
    """x split along its leading axis over the mesh's devices when traced under one; x itself without."""
    mesh = jax.sharding.get_abstract_mesh()
    return x if mesh.empty else jax.lax.with_sharding_constraint(x, PartitionSpec(mesh.axis_names))
