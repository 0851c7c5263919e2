"""A run directory's trained state (config, experiment, checkpoint), for evaluation, the Python API and warm starts."""

import dataclasses
import functools
import json
import logging
from pathlib import Path
from typing import Any

from runner.config import fingerprint
from runner.errors import ConfigError, require_bool
from runner.run import checkpoint

log = logging.getLogger(__name__)

PREVIOUS = "previous"  # init_from: the previous job of the running sweep
# The groups a run's parameters depend on: another model, lattice or dtype gives parameters of
# another shape or meaning.
PARAMETER_KEYS = ("model.", "hilbert.", "dtype.")
# Continuing a run's chains also needs its number of chains and magnetisation sector.
CHAIN_KEYS = ("sampler.n_chains", "hilbert.total_sz")
# What an evaluation may not change: the state it measures and what it measures it against.
PHYSICS_KEYS = ("hilbert.", "hamiltonian.", "model.", "dtype.")
WARM_START_KEYS = ("init_from", "init_chains")


@dataclasses.dataclass(frozen=True)
class Source:
    """Where a warm start (`init_from`) takes its initial state from.

    Attributes:
        run_dir: the source run directory (absolute).
        step: the step of its checkpoint.
        digest: its config fingerprint hash.
        chains: whether its Markov chains are continued too (`init_chains`).
    """

    run_dir: Path
    step: int
    digest: str
    chains: bool

    def identity(self) -> dict:
        """What enters the warm-started run's fingerprint: the source's fingerprint and step,
        not its path (a moved run directory starts the same numbers)."""
        return {"fingerprint": self.digest, "step": self.step, "chains": self.chains}


@dataclasses.dataclass(frozen=True)
class Trained:
    """A run's checkpoint read back with the run's own config.

    Attributes:
        run_dir: the run directory.
        config: the resolved config the run was composed with.
        experiment: `runner.config.build.Experiment` built from it (without its warm start).
        state: the `VMCState` of the checkpoint, NumPy leaves.
        meta: the checkpoint's meta dict (`step`, `seed`, `config_fingerprint`).
    """

    run_dir: Path
    config: dict
    experiment: Any
    state: Any
    meta: dict


def read_config(run_dir) -> dict:
    """The resolved config a run was composed with (Hydra's RUN_DIR/.hydra/config.yaml).

    Raises:
        ConfigError: the directory holds no such record.
    """
    from omegaconf import OmegaConf

    path = Path(run_dir) / ".hydra" / "config.yaml"
    if not path.is_file():
        raise ConfigError("run directory", f"{run_dir} holds no .hydra/config.yaml (not a run directory)")
    return OmegaConf.to_container(OmegaConf.load(path), resolve=True)


def read_overrides(run_dir) -> list[str]:
    """The command-line overrides a run was composed with (RUN_DIR/.hydra/overrides.yaml)."""
    import yaml

    path = Path(run_dir) / ".hydra" / "overrides.yaml"
    return [str(o) for o in (yaml.safe_load(path.read_text()) or [])] if path.is_file() else []


def stored_fingerprint(run_dir) -> dict:
    """The config fingerprint record ({"hash", "config"}) of a run's checkpoint; for a
    checkpoint written before fingerprints, the one of its .hydra/config.yaml."""
    record = checkpoint.read_meta(Path(run_dir) / "checkpoint").get("config_fingerprint")
    if isinstance(record, dict) and isinstance(record.get("config"), dict):
        return record
    return fingerprint.record(fingerprint.of(fingerprinted(read_config(run_dir), None)))


def fingerprinted(config: dict, source: Source | None) -> dict:
    """The config whose fingerprint a run carries: the warm-start keys replaced by the source's
    identity (its fingerprint and step) when there is one, and left out when there is none
    (a cold start has the fingerprint it had before warm starts existed)."""
    out = {k: v for k, v in config.items() if k not in WARM_START_KEYS}
    if source is not None:
        out["init_from"] = source.identity()
    return out


def refuse_difference(stored: dict, current: dict, prefixes, where: str, why: str, here: str = "this config"):
    """Raises ConfigError naming the first key under `prefixes` whose value differs between two
    flattened configs, with both values (`where` names the stored one's run, `here` the current)."""
    pick = lambda flat: {k: v for k, v in flat.items() if k.startswith(prefixes)}  # noqa: E731
    diff = fingerprint.first_difference(pick(stored), pick(current))
    if diff is not None:
        key, old, new = diff
        raise ConfigError(key, f"is {fingerprint.show(new)} in {here} but {fingerprint.show(old)} in {where}; {why}")


# --- warm starts ----------------------------------------------------------------------------


def job_dir(sweep_dir, num: int) -> Path | None:
    """The run directory of job `num` of a sweep, found by the job number Hydra records in each
    job's .hydra/hydra.yaml (whatever `hydra.sweep.subdir` names it), or None."""
    import yaml

    paths = sorted(Path(sweep_dir).rglob(".hydra/hydra.yaml"))
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
    if found is not None and (found / "summary.json").is_file():
        try:
            status = json.loads((found / "summary.json").read_text()).get("status")
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
            source's, named with both values.
    """
    value = config.get("init_from")
    chains = require_bool("init_chains", config.get("init_chains", False))
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
    if not checkpoint.exists(run_dir / "checkpoint"):
        raise ConfigError("init_from", f"is {value}, which holds no checkpoint ({run_dir / 'checkpoint'})")
    meta = checkpoint.read_meta(run_dir / "checkpoint")
    record = stored_fingerprint(run_dir)
    current = fingerprint.of(config)
    where = f"the run init_from={run_dir} (step {meta['step']})"
    refuse_difference(record["config"], current, PARAMETER_KEYS, where,
                      "a warm start needs the same model, lattice and dtype")
    if chains:
        refuse_difference(record["config"], current, CHAIN_KEYS, where,
                          "init_chains needs the same number of chains and Sz sector (or init_chains=false)")
    return Source(run_dir, int(meta["step"]), record["hash"], chains)


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
    _check_like(trained.state.params, state.params, "parameters", src.run_dir)
    state = state._replace(params=mesh.from_host(trained.state.params, shardings.params))
    if src.chains:
        _check_like(trained.state.chains, state.chains, "chains", src.run_dir)
        state = state._replace(chains=mesh.from_host(trained.state.chains, shardings.chains))
    log.info("warm start: %s of %s (step %d)", "parameters and chains" if src.chains else "parameters",
             src.run_dir, trained.meta["step"])
    return state


def _check_like(tree, like, what, run_dir):
    import jax
    import numpy as np

    a, b = jax.tree_util.tree_structure(tree), jax.tree_util.tree_structure(like)
    shapes = [(tuple(np.shape(x)), np.dtype(x.dtype)) for x in jax.tree_util.tree_leaves(tree)]
    wanted = [(tuple(x.shape), np.dtype(x.dtype)) for x in jax.tree_util.tree_leaves(like)]
    if a != b or shapes != wanted:
        raise ValueError(f"the {what} in {run_dir} do not fit this config ({shapes} vs {wanted})")


# --- reading a run back ---------------------------------------------------------------------


def experiment_of(config: dict):
    """The experiment of a run's config, without its warm start (its parameters are in its own
    checkpoint). Touches no device."""
    from runner.config.build import build

    return build({**config, "init_from": None, "init_chains": False})


def state_like(experiment):
    """Shapes and dtypes of the experiment's VMCState (`jax.ShapeDtypeStruct` leaves), under the
    current x64 setting. Touches no device."""
    import jax
    import jax.numpy as jnp

    from runner.core.vmc import init_state

    sigma_N = jax.ShapeDtypeStruct((experiment.hilbert.n_sites,), jnp.int8)
    init = functools.partial(init_state, experiment.problem, experiment.settings.seed)
    return jax.eval_shape(init, sigma_N)


def load(run_dir, experiment=None) -> Trained:
    """Reads a run's checkpoint into the state structure of the run's own config.

    Args:
        run_dir: a run directory with .hydra/config.yaml and checkpoint/.
        experiment: the run's experiment when already built (`experiment_of(read_config(run_dir))`).
            x64 must already match its dtype.

    Raises:
        ConfigError: no checkpoint, or one that does not fit the run's config.
    """
    run_dir = Path(run_dir)
    if not checkpoint.exists(run_dir / "checkpoint"):
        raise ConfigError("run directory", f"{run_dir} holds no checkpoint")
    config = read_config(run_dir)
    experiment = experiment_of(config) if experiment is None else experiment
    try:
        state, meta = checkpoint.load(run_dir / "checkpoint", state_like(experiment))
    except ValueError as err:
        raise ConfigError("run directory", f"{run_dir} holds a checkpoint that does not fit its config ({err})") from None
    return Trained(run_dir, config, experiment, state, meta)
