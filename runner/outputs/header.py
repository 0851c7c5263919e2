"""The start-up header: what a run is about to do, logged before any heavy work."""

import logging

import jax
import jax.numpy as jnp

from models.fast_paths import resolve
from runner.core.full_sum import FullSumSampler
from runner.parallel import distributed
from runner.outputs.summary import energy_unit
from runner.physics import exact

log = logging.getLogger(__name__)


def describe(group: dict) -> str:
    """`chain(L=8, pbc=True)` from a config group: the constructor and its keys."""
    group = dict(group)
    name = str(group.pop("_target_", group.pop("name", "?"))).rpartition(".")[2]

    def short(value):  # a nested node by its constructor; a graph's edge list or a Pauli sum's terms: their length
        if isinstance(value, dict) and "_target_" in value:
            return describe(value)
        return f"[{len(value)} items]" if isinstance(value, (list, dict)) and len(str(value)) > 60 else value

    return f"{name}(" + ", ".join(f"{k}={short(v)}" for k, v in group.items() if v is not None) + ")"


def paths(model) -> str:
    """Which evaluation paths the run takes: the model's declared fast paths, or the generic ones."""
    fast = resolve(model)
    names = [name for name, on in (("local ratios", fast and fast.ratio),
                                   ("Metropolis cache", fast and fast.amplitude),
                                   ("Jacobian products", fast and fast.jacobian_products)) if on]
    if not names:
        return "generic paths (full evaluations of log psi, autodiff Jacobian products)"
    return "the model's fast paths: " + ", ".join(names)


def _how(experiment, model: dict) -> str:
    """How `auto` chose the sector (`runner.config.build`), or nothing for a sector given as it is."""
    if model["sector"] != "auto":
        return ""
    if exact.wants_sectors(experiment.settings.exact, experiment.hilbert):
        return " (auto: from the exact spectrum)"
    if experiment.settings.exact == "auto":
        return (f" (auto: the trivial sector, the space being beyond the exact spectrum's "
                f"{exact.SECTOR_AUTO_MAX_STATES} states)")
    return " (auto: the trivial sector, the exact solver being off)"


def _sample_count(sampler) -> str:
    if isinstance(sampler, FullSumSampler):
        orbits = "" if sampler.symmetry == "none" else f" ({sampler.symmetry} orbits of {sampler.hilbert.n_states})"
        return (f"exact sum over {sampler.n_configurations} configurations{orbits} "
                f"on {sampler.n_chains} rows of {sampler.samples_per_chain}")
    return f"{sampler.n_samples} samples over {sampler.n_chains} chains"


def _beyond(node: dict, sampler) -> str:
    """What a full sum's `beyond` took over with, where the space was beyond its reach ('' otherwise)."""
    if not node.get("beyond") or isinstance(sampler, FullSumSampler):
        return ""
    return f", beyond the full sum's reach: {node['beyond']}"


def log_header(experiment, layout, config: dict):
    """Logs what is about to run: the task (unless a ground state), lattice, Hamiltonian (and its
    energies' unit), model (its parameter count and evaluation
    paths, its symmetry sector with `auto` resolved), sampler, optimizer, dtype, layout and steps;
    a dynamics run leaves out the optimizer, preconditioner, steps and checkpoint interval it does
    not use.

    Args:
        experiment: the run's `runner.config.build.Experiment`.
        layout: its `runner.parallel.mesh.Layout`.
        config: the plain config it was built from (each group described by its keys).
    """
    hilbert, settings = experiment.hilbert, experiment.settings
    sigma_N = jax.ShapeDtypeStruct((experiment.problem.sampler.hilbert.n_sites,), jnp.int8)  # K N with task=excited
    params = jax.eval_shape(experiment.problem.model.init, jax.random.PRNGKey(0), sigma_N)["params"]
    n_params = sum(x.size for x in jax.tree_util.tree_leaves(params))
    sampler = experiment.problem.sampler
    task = config.get("task") or {"name": "ground_state"}
    dynamics = task.get("name") == "dynamics"  # uses no optimizer, preconditioner, n_iter or checkpoint_every
    lines = [
        *([] if task.get("name") == "ground_state" else [f"task: {describe(task)}"]),
        (f"lattice: {describe(config['hilbert'])}: {hilbert.n_sites} sites, {len(hilbert.bonds)} bonds, "
         f"{len(hilbert.next_bonds)} next bonds, {hilbert.n_states} basis states"),
        f"hamiltonian: {describe(config['hamiltonian'])}; energies in {energy_unit(config['hamiltonian'].get('_target_'))}",
        f"model: {describe(config['model'])}: {n_params} parameters; {paths(experiment.problem.model)}",
        *([] if experiment.sector is None else [f"sector: {experiment.sector.name}{_how(experiment, config['model'])}"]),
        f"sampler: {describe(config['sampler'])}: {_sample_count(sampler)}{_beyond(config['sampler'], sampler)}",
        *([] if dynamics else
          [f"optimizer: {describe(config['optimizer'])}; preconditioner: {describe(config['preconditioner'])}"]),
        (f"dtype: {experiment.dtype_name}; backend: {experiment.parallel['backend']}, "
         f"{distributed.process_count()} process(es), {layout.n_devices} device(s) ({jax.devices()[0].platform})"),
        (f"seed {settings.seed} (checkpoints at every saved time)" if dynamics else
         f"steps: {settings.n_iter}, checkpoint every {settings.checkpoint_every}, seed {settings.seed}"),
    ]
    for line in lines:
        log.info(line)
