"""Turns the plain-dict experiment config into objects, validating every value first."""

import dataclasses
import importlib
import inspect
import logging
from typing import Any

import jax
import jax.numpy as jnp

from models.fast_paths import check as check_fast_paths
from runner.config import excited, fingerprint, monte_carlo, schedules, signs, task
from runner.core import memory, precond
from runner.core.full_sum import FullSumSampler, symmetry_group
from runner.core.problem import Problem
from runner.core.sampler import training_power
from runner.core.vmc import schedule_counts
from runner.errors import ConfigError, require_bool, require_choice, require_int, require_number
from runner.physics import exact, pauli, spectrum, symmetry
from runner.physics.hilbert import Hilbert
from runner.physics.pauli import Hamiltonian

log = logging.getLogger(__name__)

GROUPS = ("hilbert", "hamiltonian", "model", "sampler", "optimizer", "preconditioner", "dtype", "parallel")
# Every other top-level key the composed config may hold (read by the runner, the observables,
# the trackers or the search); anything else is a typo such as `+n_iters=5`, refused.
TOP_LEVEL = ("task", "observables", "logger", "seed", "n_iter", "checkpoint_every", "resume", "exact", "chunk_size",
             "memory_budget", "final_rounds", "init_from", "init_chains", "optimized_metric", "clip_local_energy",
             "reject_jump", "recover", "peak_search")
DTYPES = {
    "float64": (jnp.float64, True),
    "float32": (jnp.float32, False),
    "complex128": (jnp.complex128, True),
    "complex64": (jnp.complex64, False),
    "float32_mixed": (jnp.float32, True),
    "complex64_mixed": (jnp.complex64, True),
}
# Mixed precision: parameters, samples, log psi, local energies and log-derivatives in 32-bit;
# the dense solvers build S (or minSR's T) and solve in 64-bit (precond.solving_in), where a
# 32-bit Gram matrix loses half its digits to the condition number.
MIXED = ("float32_mixed", "complex64_mixed")


@dataclasses.dataclass(frozen=True)
class Settings:
    """Top-level run knobs, read as plain values."""

    seed: int
    n_iter: int
    checkpoint_every: int
    resume: bool
    exact: Any
    chunk_size: int | None
    final_rounds: int
    peak_search: int  # uniformly drawn starts of the final search for unsampled peaks (runner.diagnostics.peaks); 0: off
    # fingerprint.of(config): the keys that change the numbers, checked on resume and skip
    fingerprint: dict = dataclasses.field(default_factory=dict, compare=False)
    init_from: Any = None  # runner.lifecycle.warm_start.Source of a warm start (init_from), or None
    task: Any = None  # runner.config.task.GroundState, Dynamics (a time evolution) or Excited (the lowest states)
    memory_budget: float | None = None  # GiB a step's batch may take (automatic chunks when chunk_size is null); None: no limit


@dataclasses.dataclass(frozen=True)
class Experiment:
    """Everything built from a config, before any device or compilation is involved."""

    settings: Settings
    hilbert: Hilbert
    hamiltonian: Hamiltonian
    problem: Problem
    dtype_name: str
    x64: bool
    parallel: dict
    observables: Any = None  # runner.physics.observables.Observables, or None (observables=none)
    sector: Any = None  # runner.physics.symmetry.Sector the model projects onto (`auto` resolved), or None


# Constructor arguments the runner passes itself (`instantiate`'s runtime keywords), and where from.
RUNTIME_SOURCES = {
    "param_dtype": "by the runner from the dtype group (e.g. dtype=float32)",
    "hilbert": "by the runner from the hilbert group",
}


# Module paths of `_target_`s in run directories written before runner/ was split by concern.
MOVED_MODULES = {
    "runner.hilbert": "runner.physics.hilbert", "runner.operators": "runner.physics.hamiltonians",
    "runner.observables": "runner.physics.observables", "runner.sampler": "runner.core.sampler",
    "runner.precond": "runner.core.precond", "runner.hparams_search": "runner.lifecycle.hparams_search",
}


def _import(target: str):
    module, _, name = target.rpartition(".")
    module = MOVED_MODULES.get(module, module)
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise ConfigError("_target_", f"{target!r} cannot be imported ({err})") from None


def _accepted_keys(fn) -> list[str]:
    params = inspect.signature(fn).parameters.values()
    return [p.name for p in params if p.name not in ("self", "parent", "name") and p.kind != p.VAR_KEYWORD]


def instantiate(group: str, node: dict, **runtime):
    """Calls `node['_target_']` with the node's keys as arguments (plus `runtime` ones).

    Keys map one-to-one onto constructor arguments; an unknown key or a bad value becomes a
    ConfigError naming `group.key`.
    """
    node = dict(node)
    target = node.pop("_target_", None)
    if target is None:
        raise ConfigError(f"{group}._target_", "is missing")
    fn = _import(target)
    allowed = _accepted_keys(fn)
    unknown = sorted(set(node) - set(allowed))
    if unknown:
        options = ", ".join(k for k in allowed if k not in runtime)
        # the command line's keys were checked against the composed option: this one is from a config file
        raise ConfigError(f"{group}.{unknown[0]}", f"is not a key of {group}; its keys are: {options} (a config "
                                                   f"file sets it, e.g. the experiment; ~{group}.{unknown[0]} removes it)")
    collide = [k for k in node if k in runtime]
    if collide:
        source = RUNTIME_SOURCES.get(collide[0], "by the runner")
        raise ConfigError(f"{group}.{collide[0]}", f"is set {source}; remove it")
    try:
        return fn(**node, **runtime)
    except ConfigError as err:
        absolute = "." in err.key or err.key == group  # e.g. hilbert.total_sz raised by a Hamiltonian
        raise ConfigError(err.key if absolute else f"{group}.{err.key}", err.message) from None
    except (TypeError, ValueError) as err:
        # A constructor refusing a value of the right name but the wrong kind (a string for a
        # number, a number for a list): still a config error, not a traceback.
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ConfigError(group, f"cannot be built from its keys ({target}: {reason}); check their values") from None


def _observables(node: dict | None, hilbert, hamiltonian):
    """The observables of the config group `observables` (None or missing: none)."""
    return None if node is None else instantiate("observables", node, hilbert=hilbert, hamiltonian=hamiltonian)


def read_settings(config: dict) -> Settings:
    """The top-level knobs; a warm start (`init_from`) is resolved by the run (`runner.lifecycle.warm_start`)."""
    seed = require_int("seed", config.get("seed"), minimum=0)
    n_iter = require_int("n_iter", config.get("n_iter"), minimum=0)
    checkpoint_every = require_int("checkpoint_every", config.get("checkpoint_every"), minimum=1)
    resume = require_bool("resume", config.get("resume"))
    exact = require_choice("exact", config.get("exact"), ("auto", True, False))
    chunk_size = config.get("chunk_size")
    if chunk_size is not None:
        require_int("chunk_size", chunk_size, minimum=1)
    budget = config.get("memory_budget")
    if budget is not None:
        require_number("memory_budget", budget, positive=True)
    final_rounds = require_int("final_rounds", config.get("final_rounds"), minimum=1)
    peak_search = require_int("peak_search", config.get("peak_search"), minimum=0)
    the_task = task.read(config.get("task"), instantiate)
    if (isinstance(the_task, task.Dynamics) and the_task.initial_state == "init_from"
            and config.get("init_from") is None):
        raise ConfigError("task.initial_state", "is init_from, which needs init_from=RUN_DIR (a run whose state to evolve)")
    return Settings(seed, n_iter, checkpoint_every, resume, exact, chunk_size, final_rounds, peak_search,
                    fingerprint.of(fingerprint.fingerprinted(config, None)), None, the_task,
                    None if budget is None else float(budget))


def _reject_jump(config: dict, optimizer, learning_rate) -> float | None:
    """`reject_jump` as a number (null: None); a schedule must be one optax count (a rejection takes it back)."""
    reject = config.get("reject_jump")
    if reject is None:
        return None
    require_number("reject_jump", reject, positive=True)
    if learning_rate is not None and len(_schedule_counts(optimizer)) != 1:
        raise ConfigError("reject_jump", "must be null with a learning-rate schedule that optax does not count in "
                                         "one ScaleByScheduleState (a rejected step takes the optimizer back, "
                                         "and the runner must read the count its schedule reads)")
    return float(reject)


def _recover(config: dict, the_task) -> int:
    """`recover` as a count (null: 0): it lowers reject_jump's step scale in a ground-state training."""
    recover = config.get("recover")
    if recover is None:
        return 0
    require_int("recover", recover, minimum=1)
    if config.get("reject_jump") is None:
        raise ConfigError("recover", "needs reject_jump (a recovery lowers the ceiling of the step scale "
                                     "reject_jump keeps); set reject_jump=4, say, or recover=null")
    if not isinstance(the_task, task.GroundState):
        raise ConfigError("recover", "applies to task=ground_state only; set recover=null")
    return recover


def _check_chunk(chunk_size, sampler):
    if chunk_size is None:
        return
    per_chain = sampler.n_samples // sampler.n_chains
    if chunk_size % sampler.n_chains or per_chain % (chunk_size // sampler.n_chains):
        raise ConfigError(
            "chunk_size",
            f"must be a multiple of sampler.n_chains={sampler.n_chains} that divides "
            f"sampler.n_samples={sampler.n_samples} evenly per chain (got {chunk_size})",
        )


def _check_physics(config, settings, hilbert, hamiltonian, dtype_name):
    """Refuses the exchange sampler for an H that does not conserve Sz and `exact: true`
    beyond the available memory."""
    if str(config["sampler"].get("_target_", "")).endswith("metropolis_exchange") and not pauli.conserves_sz(hamiltonian):
        raise ConfigError(
            "sampler", "metropolis_exchange conserves Sz, which this Hamiltonian does not; "
            "use hilbert.total_sz=null sampler=metropolis_local"
        )
    if settings.exact is True:
        need, have = exact.required_bytes(hilbert), exact.available_bytes()
        if have is not None and need > have:
            raise ConfigError(
                "exact",
                f"true needs about {need / 2**30:.3g} GiB for the {hilbert.n_states} basis states of this "
                f"lattice but {have / 2**30:.3g} GiB is available; use exact=false or exact=auto",
            )


def _check_full_sum(config, problem):
    """Refuses what a full sum does not do: clipping (no outliers to clip in exact sums), step
    rejection (no error bars to compare a jump with), SPRING (its kernel correction assumes
    equal sample weights) and a symmetry that H does not have. (The model's invariance needs its evaluation: checked when the
    run starts, `runner.core.vmc.full_sum_invariance_error`.)"""
    sampler = problem.sampler
    if sampler.symmetry != "none":
        g = pauli.not_invariant_under(problem.hamiltonian, symmetry_group(sampler.hilbert, sampler.symmetry))
        if g is not None:
            raise ConfigError("sampler.symmetry", f"{sampler.symmetry} needs a Hamiltonian invariant under the "
                                                  f"group, and this one is not (element {g}); use sampler.symmetry=none")
    if problem.clip_local_energy is not None:
        raise ConfigError("clip_local_energy", "must be null with sampler=full_sum (exact sums have no outlying "
                                               "samples to clip)")
    if problem.reject_jump is not None:
        raise ConfigError("reject_jump", "must be null with sampler=full_sum (exact sums have no error bars to "
                                         "compare a jump with)")
    if config["preconditioner"].get("momentum"):
        raise ConfigError("preconditioner.momentum", "must be 0 with sampler=full_sum (SPRING assumes equally "
                                                     "weighted samples)")


def _with_schedule(config: dict, group: str, key: str):
    """(the group's node, schedule): a `_target_` node under `group.key` built into a schedule
    (a function of the VMC step, runner.config.schedules) and checked, the node carrying the schedule in
    its place; (the node as it is, None) when the key holds anything else."""
    node = config[group]
    if not isinstance(node.get(key), dict):
        return node, None
    name = f"{group}.{key}"
    schedule = instantiate(name, node[key])
    schedules.check(name, schedule, str(node[key].get("_target_")))
    return {**node, key: schedule}, schedule


def _schedule_counts(optimizer) -> list:
    """`vmc.schedule_counts` of the optimizer's state, from shapes only (no device)."""
    return schedule_counts(jax.eval_shape(optimizer.init, {"w": jax.ShapeDtypeStruct((2,), jnp.float32)}))


def _lattice_for(node: dict, hilbert: Hilbert) -> dict:
    """{"hilbert": hilbert} for a model whose constructor takes the lattice, else {}."""
    target = node.get("_target_")
    return {"hilbert": hilbert} if target and "hilbert" in _accepted_keys(_import(target)) else {}


def _sector(node: dict, settings: Settings, hilbert: Hilbert, hamiltonian: Hamiltonian, lattice_group=None):
    """The model's `sector` as a `runner.physics.symmetry.Sector`, or None (null, or a model without
    the key). `auto` is the exact ground state's sector where the run's exact solver runs (the
    trivial sector, with one warning, where a 2-D irrep holds it), else the trivial sector: k = 0,
    the fully symmetric irrep, no parity. The spectrum by sector behind `auto` is the run's
    (`runner.physics.spectrum` keeps it; spectrum.json and the sector fields reuse it). A sector
    of a space group the Hamiltonian does not commute with is refused: `hilbert` carries the subgroup H
    keeps (`symmetry.keeping`: a phase prior's), so only an H that lacks a translation meets it."""
    target = node.get("_target_")
    if "sector" not in node or not target or "sector" not in _accepted_keys(_import(target)):
        return None
    group = symmetry.space_group(hilbert)
    try:
        sector = symmetry.parse_sector(node["sector"], hilbert, "model.sector", group)
    except ConfigError as err:
        if lattice_group is None or lattice_group == group:
            raise
        raise ConfigError(err.key, f"{err.message}, within the {len(group.perm_ExN)} of the lattice's "
                                   f"{len(lattice_group.perm_ExN)} space-group elements this Hamiltonian keeps") from None
    if sector is None:
        return None
    if sector == "auto" and exact.wants_sectors(settings.exact, hilbert):
        return _ground_sector(hamiltonian, hilbert, symmetry.trivial_sector(hilbert, group))
    if (g := pauli.not_invariant_under(hamiltonian, symmetry_group(hilbert, "lattice"))) is not None:
        raise ConfigError("model.sector", f"projects onto a sector of the space group, whose element {g} this "
                                          "Hamiltonian lacks (e.g. a phase prior's); use model.sector=null")
    return symmetry.trivial_sector(hilbert, group) if sector == "auto" else sector


def _symmetry(node: dict, settings: Settings, hilbert: Hilbert, hamiltonian: Hamiltonian):
    """(the Hilbert space carrying the space group H keeps, `symmetry.keeping`: the lattice's
    without a phase prior; the model's sector over that group, `_sector`)."""
    kept = symmetry.keeping(hilbert, hamiltonian)
    return kept, _sector(node, settings, kept, hamiltonian, hilbert.space_group)


def _ground_sector(hamiltonian: Hamiltonian, hilbert: Hilbert, trivial):
    """`model.sector: auto`'s sector where the exact spectrum by sector runs: the ground state's (`trivial`,
    with one warning, where a 2-D irrep holds it)."""
    try:
        ground, _ = spectrum.ground_sector(hamiltonian, hilbert)
    except ValueError as err:
        raise ConfigError("model.sector", f"auto needs the exact ground state's sector, and {err}; set the sector "
                                          "or null") from None
    if ground is None:
        log.warning("model.sector: auto found the exact ground state in a two-dimensional irrep, which no sector "
                    "projects onto; using the trivial sector %s", trivial.name)
        return trivial
    return ground


def _with_chunks(settings: Settings, problem: Problem, param_dtype):
    """Settings and problem with the chunk the memory budget asks for (`memory.chunk_for`) when
    chunk_size is null; the fingerprint then holds that chunk, so a resume checks the chunks
    (which change the last bits) rather than the budget. An explicit chunk_size is checked."""
    _check_chunk(settings.chunk_size, problem.sampler)
    if settings.chunk_size is not None or settings.memory_budget is None or problem.sampler is None:
        return settings, problem
    ham = problem.hamiltonian
    per_sample = memory.bytes_per_sample(problem.model, ham.n_sites, ham.n_connected, jnp.dtype(param_dtype).itemsize)
    chunk = memory.chunk_for(problem.sampler.n_samples, problem.sampler.n_chains, per_sample,
                             settings.memory_budget * memory.GIB)
    if chunk is None:
        return settings, problem
    log.info("samples evaluated %d at a time: about %.3g MiB each, memory_budget=%g GiB (chunk_size overrides)",
             chunk, per_sample / 2**20, settings.memory_budget)
    fp = {**settings.fingerprint, "chunk_size": chunk} if "chunk_size" in settings.fingerprint else settings.fingerprint
    return (dataclasses.replace(settings, chunk_size=chunk, fingerprint=fp),
            dataclasses.replace(problem, chunk_size=chunk))


def build(config: dict) -> Experiment:
    """Validates the whole config and builds the experiment. Touches no device and reads no other
    run's files (a warm start is resolved by the run: `runner.lifecycle.warm_start.resolve`).

    Raises:
        ConfigError: naming the first bad key.
    """
    config = monte_carlo.resolve(config, instantiate)
    missing = [g for g in GROUPS if not isinstance(config.get(g), dict)]
    if missing:
        raise ConfigError(missing[0], "is missing from the config")
    unknown = [k for k in config if k not in GROUPS + TOP_LEVEL]
    if unknown:
        raise ConfigError(unknown[0], f"is not a key of the config; top-level keys are: {', '.join(TOP_LEVEL)}, "
                                      f"and the groups {', '.join(GROUPS)}")
    extra = sorted(set(config["dtype"]) - {"name"})
    if extra:
        raise ConfigError(f"dtype.{extra[0]}", "is not a key of dtype; choose the dtype with dtype=NAME")
    settings = read_settings(config)
    dtype_name = config["dtype"].get("name")
    require_choice("dtype", dtype_name, tuple(DTYPES))
    param_dtype, x64 = DTYPES[dtype_name]
    hilbert = instantiate("hilbert", config["hilbert"])
    hamiltonian = instantiate("hamiltonian", config["hamiltonian"], hilbert=hilbert)
    _check_physics(config, settings, hilbert, hamiltonian, dtype_name)
    hilbert, sector = _symmetry(config["model"], settings, hilbert, hamiltonian)
    n_states = excited.n_states_of(config, settings.task, hilbert, sector)  # None unless task=excited
    model_cfg = config["model"] if sector is None else {**config["model"], "sector": sector}
    model = instantiate("model", model_cfg, param_dtype=param_dtype, **_lattice_for(config["model"], hilbert))
    check_fast_paths(type(model))  # a partial fast-path declaration is refused before anything compiles
    signs.check(model, hilbert, hamiltonian, dtype_name, n_states is not None, config["hamiltonian"])
    sampler = instantiate("sampler", config["sampler"], hilbert=excited.sampled_space(hilbert, n_states))
    optimizer_cfg, learning_rate = _with_schedule(config, "optimizer", "learning_rate")
    if learning_rate is None:
        require_number("optimizer.learning_rate", optimizer_cfg.get("learning_rate"), positive=True)
    optimizer = instantiate("optimizer", optimizer_cfg)
    precondition = instantiate("preconditioner", _with_schedule(config, "preconditioner", "diag_shift")[0])
    if dtype_name in MIXED:
        precondition = precond.solving_in(precondition, jnp.float64)
    clip = config.get("clip_local_energy")
    if clip is not None:
        require_number("clip_local_energy", clip, positive=True)
    problem = Problem(hamiltonian, model, sampler, optimizer, precondition, settings.chunk_size, learning_rate,
                      None if clip is None else float(clip), _reject_jump(config, optimizer, learning_rate),
                      _recover(config, settings.task))
    observed = _observables(config.get("observables"), hilbert, hamiltonian)
    problem = excited.problem_of(problem, n_states, observed)
    settings, problem = _with_chunks(settings, problem, param_dtype)
    if isinstance(sampler, FullSumSampler):
        _check_full_sum(config, problem)
    if training_power(sampler) != 2.0 and config["preconditioner"].get("momentum"):
        raise ConfigError("preconditioner.momentum", "must be 0 with sampler.machine_pow other than 2 (SPRING "
                                                     "assumes equally weighted samples)")
    return Experiment(settings, hilbert, hamiltonian, problem, dtype_name, x64, dict(config["parallel"]), observed,
                      sector)
