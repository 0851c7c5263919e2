"""Warm starts (`init_from`): the source run found and checked against this config, its state taken over."""

import dataclasses
import json
import logging
from pathlib import Path

from runner.config import fingerprint
from runner.errors import ConfigError, require_bool
from runner.lifecycle import checkpoint, rundir, transfer
from runner.lifecycle.load import load, refuse_difference, stored_fingerprint

log = logging.getLogger(__name__)

PREVIOUS = "previous"  # init_from: the previous job of the running sweep

# The groups a run's parameters depend on: another model, lattice or dtype gives parameters of
# another shape or meaning.
PARAMETER_KEYS = ("model.", "hilbert.", "dtype.")

# Continuing a run's chains also needs its number of chains and magnetisation sector.
CHAIN_KEYS = ("sampler.n_chains", "hilbert.total_sz")


@dataclasses.dataclass(frozen=True)
class Source:
    """Where a warm start (`init_from`) takes its initial state from.

    Attributes:
        run_dir: the source run directory (absolute).
        step: the step of its checkpoint.
        digest: its config fingerprint hash.
        chains: whether its Markov chains are continued too (`init_chains`).
        transfer: whether its parameters are mapped onto another torus size or a more symmetric
            model (`runner.lifecycle.transfer`) rather than taken as they are.
    """

    run_dir: Path
    step: int
    digest: str
    chains: bool
    transfer: bool = False

    def identity(self) -> dict:
        """What enters the warm-started run's fingerprint: the source's fingerprint and step,
        not its path (a moved run directory starts the same numbers)."""
        return {"fingerprint": self.digest, "step": self.step, "chains": self.chains}


def job_dir(sweep_dir, num: int) -> Path | None:
    """The run directory of job `num` of a sweep, found by the job number Hydra records in each
    job's .hydra/hydra.yaml (whatever `hydra.sweep.subdir` names it), or None."""
    import yaml

    paths = sorted(Path(sweep_dir).rglob(rundir.HYDRA_CONFIG))
    # the default subdir starts with the job number: look there first
    paths.sort(key=lambda p: not (p.parent.parent.name == str(num) or p.parent.parent.name.startswith(f"{num}_")))
    for path in paths:
        try:
            job = yaml.safe_load(path.read_text())["hydra"]["job"]
        except (OSError, yaml.YAMLError, KeyError, TypeError):
            continue
        if job.get("num") == num:
            return path.parent.parent
    return None


def _previous_run(sweep_job) -> Path | None:
    """The run directory `init_from: previous` names: the previous job of a sequential sweep
    (None for its first job, or outside a sweep: a cold start)."""
    if sweep_job is None or sweep_job[1] == 0:
        log.info("init_from=previous: %s, starting cold",
                 "the first job of the sweep" if sweep_job else "not in a sweep")
        return None
    sweep_dir, num = sweep_job
    found = job_dir(sweep_dir, num - 1)
    status = None
    if found is not None and (found / rundir.SUMMARY).is_file():
        try:
            status = json.loads((found / rundir.SUMMARY).read_text()).get("status")
        except ValueError:
            status = None
    if status != "completed":
        state = "no run directory" if found is None else f"status {status or 'unknown (still running?)'}"
        raise ConfigError(
            "init_from",
            f"is previous, but job {num - 1} of the sweep in {sweep_dir} has {state}; chain a sweep's "
            "points only with a sequential launcher (the default basic one), or give a run directory",
        )
    return found


def source(config: dict, sweep_job=None) -> Source | None:
    """The warm start a config asks for (`init_from`, `init_chains`), checked against the source.

    Reads only the source's checkpoint meta (no arrays, no device).

    Args:
        config: the plain experiment config.
        sweep_job: (sweep directory, job number) of the running multirun job, for
            `init_from: previous` (the app finds it; None outside a sweep).

    Returns:
        The Source, or None for a cold start.

    Raises:
        ConfigError: no checkpoint there, or a model, lattice or dtype key (and for
            `init_chains`, the number of chains or the Sz sector) that differs from the
            source's, named with both values; a transfer's (another torus size, a more
            symmetric model) only as `transfer.check` allows.
    """
    value = config.get("init_from")
    chains = require_bool("init_chains", config.get("init_chains"))
    if value is None:
        if chains:
            raise ConfigError("init_chains", "is true but init_from is null; give init_from a run directory or previous")
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError("init_from", f"must be a run directory, previous or null (got {value!r})")
    if value == PREVIOUS:
        run_dir = _previous_run(sweep_job)
        if run_dir is None:
            return None
    else:
        run_dir = Path(value).expanduser()
    run_dir = run_dir.resolve()
    if not checkpoint.exists(run_dir / rundir.CHECKPOINT):
        raise ConfigError("init_from", f"is {value}, which holds no checkpoint ({run_dir / rundir.CHECKPOINT})")
    meta = checkpoint.read_meta(run_dir / rundir.CHECKPOINT)
    record = stored_fingerprint(run_dir)
    current = fingerprint.of(config)
    where = f"the run init_from={run_dir} (step {meta['step']})"
    relaxed = transfer.relaxed(record["config"], current)
    if relaxed:
        transfer.check(record["config"], current, where, chains)
    refuse_difference(record["config"], current, PARAMETER_KEYS, where,
                      "a warm start needs the same model, lattice and dtype (or a transfer: another torus size, "
                      "a more symmetric model)" if relaxed else "a warm start needs the same model, lattice and dtype",
                      ignore=relaxed)
    if chains:
        refuse_difference(record["config"], current, CHAIN_KEYS, where,
                          "init_chains needs the same number of chains and Sz sector (or init_chains=false)")
    return Source(run_dir, int(meta["step"]), record["hash"], chains, bool(relaxed))


def resolve(experiment, config: dict, sweep_job=None):
    """The experiment with its warm start: the source run found, checked against `config`, and
    its identity in the fingerprint. `sweep_job`: see `source`."""
    src = source(config, sweep_job)
    if src is None:
        return experiment
    settings = dataclasses.replace(experiment.settings, init_from=src,
                                   fingerprint=fingerprint.of(fingerprint.fingerprinted(config, src)))
    return dataclasses.replace(experiment, settings=settings)


def warm_start(experiment, state, shardings):
    """The initial state with the parameters (and with `init_chains`, the chains) of the
    experiment's `init_from` run; `state` itself for a cold start.

    The optimizer and preconditioner states stay fresh. The source checkpoint is read on every
    process (as a resume does), so any layout can start from any other's run.

    Args:
        experiment: the `runner.config.build.Experiment` of this run (its settings name the source).
        state: the freshly initialised VMCState (global arrays).
        shardings: its shardings (a VMCState of shardings).
    """
    from runner.parallel import mesh

    src = getattr(experiment.settings, "init_from", None)
    if src is None:
        return state
    trained = load(src.run_dir)
    params = trained.state.params
    if src.transfer:
        params = transfer.params(params, trained.experiment.problem.model, trained.experiment.hilbert,
                                 experiment.problem.model, experiment.hilbert)
    _check_like(params, state.params, "parameters", src.run_dir)
    state = state._replace(params=mesh.from_host(params, shardings.params))
    if src.chains:
        _check_like(trained.state.chains, state.chains, "chains", src.run_dir)
        state = state._replace(chains=mesh.from_host(trained.state.chains, shardings.chains))
    log.info("warm start: %s of %s (step %d)%s", "parameters and chains" if src.chains else "parameters",
             src.run_dir, trained.meta["step"], ", transferred" if src.transfer else "")
    return state


def _check_like(tree, like, what, run_dir):
    import jax
    import numpy as np

    a, b = jax.tree_util.tree_structure(tree), jax.tree_util.tree_structure(like)
    shapes = [(tuple(np.shape(x)), np.dtype(x.dtype)) for x in jax.tree_util.tree_leaves(tree)]
    wanted = [(tuple(x.shape), np.dtype(x.dtype)) for x in jax.tree_util.tree_leaves(like)]
    if a != b or shapes != wanted:
        raise ValueError(f"the {what} in {run_dir} do not fit this config ({shapes} vs {wanted})")
