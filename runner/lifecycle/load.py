"""A run directory read back: its config, overrides, fingerprint and checkpoint in the state of its own config."""

import dataclasses
import functools
import logging
from pathlib import Path
from typing import Any

from runner.config import fingerprint
from runner.config.build import build
from runner.config.task import Dynamics
from runner.errors import ConfigError
from runner.lifecycle import checkpoint, rundir

log = logging.getLogger(__name__)

# What an evaluation may not change: the state it measures and what it measures it against.
PHYSICS_KEYS = ("hilbert.", "hamiltonian.", "model.", "dtype.")


@dataclasses.dataclass(frozen=True)
class Trained:
    """A run's checkpoint read back with the run's own config.

    Attributes:
        run_dir: the run directory.
        config: the resolved config the run was composed with.
        experiment: `runner.config.build.Experiment` built from it (without its warm start).
        state: the `VMCState` of the checkpoint, NumPy leaves (a time evolution's: its parameters
            and chains at its last saved time).
        meta: the checkpoint's meta dict (`step`, `seed`, `config_fingerprint`; a time
            evolution's also `t`, its last saved time, and `step` is that time's index).
    """

    run_dir: Path
    config: dict
    experiment: Any
    state: Any
    meta: dict


def read_config(run_dir) -> dict:
    """The resolved config a run was composed with (Hydra's RUN_DIR/.hydra/config.yaml).

    Raises:
        ConfigError: the directory holds no such record, or a key the runner no longer has at a
        value other than the one that behaved as today's code does (`fingerprint.without_retired`).
        A config in an older spelling is read in today's (`fingerprint.upgraded`).
    """
    from omegaconf import OmegaConf

    path = Path(run_dir) / rundir.CONFIG
    if not path.is_file():
        raise ConfigError("run directory", f"{run_dir} holds no {rundir.CONFIG} (not a run directory)")
    return fingerprint.without_retired(fingerprint.upgraded(OmegaConf.to_container(OmegaConf.load(path), resolve=True)))


def read_overrides(run_dir) -> list[str]:
    """The command-line overrides a run was composed with (RUN_DIR/.hydra/overrides.yaml), as
    today's conf/ reads them (`fingerprint.without_retired_overrides`: a retired key's left out,
    an old spelling in today's)."""
    import yaml
    from omegaconf import OmegaConf

    path = Path(run_dir) / rundir.OVERRIDES
    lines = [str(o) for o in (yaml.safe_load(path.read_text()) or [])] if path.is_file() else []
    config = Path(run_dir) / rundir.CONFIG
    stored = OmegaConf.to_container(OmegaConf.load(config), resolve=True) if config.is_file() else {}
    return fingerprint.without_retired_overrides(lines, stored)


def stored_fingerprint(run_dir) -> dict:
    """The config fingerprint record ({"hash", "config"}) of a run's checkpoint; for a
    checkpoint written before fingerprints, the one of its .hydra/config.yaml."""
    record = checkpoint.read_meta(Path(run_dir) / rundir.CHECKPOINT).get("config_fingerprint")
    if isinstance(record, dict) and isinstance(record.get("config"), dict):
        return record
    return fingerprint.record(fingerprint.of(fingerprint.fingerprinted(read_config(run_dir), None)))


def refuse_difference(stored: dict, current: dict, prefixes, where: str, why: str, here: str = "this config", *,
                      ignore=()):
    """Raises ConfigError naming the first key under `prefixes` but not in `ignore` whose value
    differs between two flattened configs, with both values (`where` names the stored one's run,
    `here` the current)."""
    pick = lambda flat: {k: v for k, v in flat.items() if k.startswith(prefixes)}  # noqa: E731
    diff = fingerprint.first_difference(pick(stored), pick(current), ignore)
    if diff is not None:
        key, old, new = diff
        raise ConfigError(key, f"is {fingerprint.show(new)} in {here} but {fingerprint.show(old)} in {where}; {why}")


def experiment_of(config: dict):
    """The experiment of a run's config (`read_config`'s), without its warm start (its parameters
    are in its own checkpoint; a time evolution's too, whatever it started from). Touches no device."""
    task = config.get("task")
    if isinstance(task, dict) and task.get("initial_state") == "init_from":  # the evolved state is its own
        task = {**task, "initial_state": "plus_x"}
    return build({**config, "task": task, "init_from": None, "init_chains": False})


def state_like(experiment, vmc: bool = False):
    """Shapes and dtypes of the state the experiment's checkpoint holds (`jax.ShapeDtypeStruct`
    leaves), under the current x64 setting: its VMCState, or for a time evolution (task=dynamics)
    its `runner.core.tdvp.DynamicsState` (`vmc`: the VMCState all the same). Touches no device."""
    import jax
    import jax.numpy as jnp

    from runner.core.tdvp import start, time_derivative
    from runner.core.vmc import init_state

    sigma_N = jax.ShapeDtypeStruct((experiment.problem.sampler.hilbert.n_sites,), jnp.int8)  # K N sites: task=excited
    init = functools.partial(init_state, experiment.problem, experiment.settings.seed)
    like = jax.eval_shape(init, sigma_N)
    task = experiment.settings.task
    if not isinstance(task, Dynamics) or vmc:
        return like
    begin = functools.partial(start, task.integrator, time_derivative(experiment.problem, task.equation))
    return jax.eval_shape(begin, like.params, like.chains)


def _as_vmc_state(state, experiment):
    """A time evolution's checkpointed state as a VMCState: its parameters and Markov chains at
    the saved time, the optimizer's fields zero (a time evolution has none)."""
    import jax
    import numpy as np

    fresh = jax.tree_util.tree_map(lambda x: np.zeros(x.shape, x.dtype), state_like(experiment, vmc=True))
    return fresh._replace(params=state.params, chains=state.integrator.carry)


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
    if not checkpoint.exists(run_dir / rundir.CHECKPOINT):
        raise ConfigError("run directory", f"{run_dir} holds no checkpoint")
    config = read_config(run_dir)
    experiment = experiment_of(config) if experiment is None else experiment
    try:
        state, meta = checkpoint.load(run_dir / rundir.CHECKPOINT, state_like(experiment))
    except checkpoint.CorruptCheckpoint:  # one sentence naming the file
        raise
    except ValueError as err:
        raise ConfigError("run directory", f"{run_dir} holds a checkpoint that does not fit its config ({err})") from None
    if isinstance(experiment.settings.task, Dynamics):
        state = _as_vmc_state(state, experiment)
    return Trained(run_dir, config, experiment, state, meta)
