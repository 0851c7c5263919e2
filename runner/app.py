"""One VMC run from a composed config: the only module besides the entry point that sees Hydra."""

import contextlib
import json
import logging
import sys
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from runner.config import monte_carlo
from runner.config.build import Experiment, build, instantiate
from runner.errors import ConfigError, RunEnded, RunFailed, RunStopped
from runner.lifecycle import dynamics, hparams_search, loop, rundir, tasks, warm_start
from runner.lifecycle.preemption import StopRequest
from runner.outputs import loggers
from runner.outputs.header import log_header
from runner.parallel import distributed, mesh

log = logging.getLogger(__name__)



def run(cfg: DictConfig, run_dir: str | None = None, new_dirs=frozenset(), overrides=()) -> dict | float:
    """Runs the experiment in `cfg` (see `_run`; `overrides`: those composed into `cfg` when Hydra did
    not run the command); under the Optuna sweeper, returns the trial's
    objective instead of the summary: `optimized_metric` of the summary, or a large penalty for a
    failed run (which never raises there: a failed trial must not end the study)."""
    if not _optuna_sweep(run_dir):
        return _run(cfg, run_dir, new_dirs, overrides)
    from hydra.core.hydra_config import HydraConfig

    direction = str(HydraConfig.get().sweeper.get("direction", "minimize"))
    metric = str(cfg["optimized_metric"])
    trial_dir = HydraConfig.get().runtime.output_dir
    return hparams_search.run_trial(lambda: _run(cfg, run_dir, new_dirs), trial_dir, metric, direction)


def _optuna_sweep(run_dir) -> bool:
    """Whether this is a job of Hydra's Optuna sweeper (which wants a number back)."""
    from hydra.core.hydra_config import HydraConfig

    if run_dir is not None or not HydraConfig.initialized():
        return False
    return "optuna" in str(HydraConfig.get().sweeper.get("_target_", "")).lower()


def _run(cfg: DictConfig, run_dir: str | None = None, new_dirs=frozenset(), overrides=()) -> dict:
    """Runs the experiment described by `cfg` in `run_dir` (Hydra's output directory).

    `new_dirs`: directories that did not exist when the command started; a single run's config
    error removes its run directory (and new parents) if it is one of them.

    A bad config value raises its ConfigError before anything compiles; in a multirun it is
    recorded as the point's failure (summary.json, status `failed`), its sentence printed, and
    the sweep goes on. A stop signal (SIGTERM, SIGUSR2, Ctrl-C) is honoured from the moment the
    config is valid: the run stops at the next step boundary and raises RunStopped; a failed run
    raises RunFailed (`execute`).

    Returns:
        The summary dict (also written to summary.json).

    Raises:
        ConfigError, RunFailed, RunStopped, DistributedInitError: turned into exit statuses 2, 1,
            3 or 130, and 1 by the entry point (`runner.cli`).
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    config = OmegaConf.to_container(cfg, resolve=True)
    from_hydra = run_dir is None
    run_dir = Path(run_dir or HydraConfig.get().runtime.output_dir)
    multirun = from_hydra and HydraConfig.get().mode == RunMode.MULTIRUN
    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)  # "no TPU found" noise
    conflict = None  # the run directory holds another config's run
    try:
        config = monte_carlo.resolve(config, instantiate, HydraConfig.get().overrides.task if from_hydra else overrides,
                                     say=True)
        experiment = warm_start.resolve(build(config), config, _sweep_job() if multirun else None)
        try:
            rundir.check_run_dir(run_dir, experiment.settings)
        except ConfigError as err:
            conflict = err
            raise
        layout, tracking = _set_up(experiment, config, run_dir)
        dynamics.check(experiment)  # initial_state plus_x: a model that cannot represent it
    except ConfigError as err:
        return _config_error(err, run_dir, multirun, new_dirs if from_hydra else None, other_run=err is conflict)
    _quiet_other_ranks()
    with StopRequest() as stop:  # before any heavy work (exact energy, compilation)
        log.info("run directory: %s", run_dir.resolve())
        try:
            log_header(experiment, layout, config)
            return execute(experiment, layout, run_dir, stop=stop, tracking=tracking)
        except (ConfigError, RunEnded):  # said by the entry point; a failed run's summary is written
            raise
        except Exception as err:
            # Every rank reports its own failure: launchers often show only rank 0's.
            log.exception("process %d of %d failed", distributed.process_index(), distributed.process_count())
            if distributed.is_main():
                _write_failure(run_dir, err)
                tracking.close(json.loads((run_dir / rundir.SUMMARY).read_text()))
            raise RunFailed(json.loads((run_dir / rundir.SUMMARY).read_text()) if distributed.is_main()
                            else {"status": "failed", "reason": f"{type(err).__name__}: {err}"}) from err


def _set_up(experiment: Experiment, config: dict, run_dir: Path):
    """(layout, trackers): the processes and the mesh, and the chosen trackers (a missing library
    is a config error)."""
    distributed.initialize(experiment.parallel, experiment.x64)
    layout = mesh.make_mesh(experiment.parallel["backend"])
    mesh.check_chains(experiment.problem.sampler.n_chains, layout)
    hparams_search.check(config)
    return layout, loggers.setup(config, run_dir, _sweep_dir(), artifacts=rundir.ARTIFACTS)


def _config_error(err: ConfigError, run_dir: Path, multirun: bool, new_dirs, *, other_run: bool) -> dict:
    """A bad config: raised again (after removing the run directory if `new_dirs`, the
    directories this command made, hold it); in a multirun its sentence and the point's failure,
    and the sweep goes on (the files of another config's run, `other_run`, stay as they are)."""
    if not multirun:
        if new_dirs is not None:
            rundir.remove_if_new(run_dir, new_dirs)
        raise err
    print(f"Config error: {err.sentence()}", file=sys.stderr)
    if other_run:
        return {"status": "failed", "reason": f"config error: {err.sentence()}"}
    failure = {"status": "failed", "reason": f"config error: {err.sentence()}",
               "error": f"ConfigError: {err.sentence()}"}
    run_dir.mkdir(parents=True, exist_ok=True)
    rundir.write_summary(run_dir, failure)
    return failure


def _quiet_other_ranks():
    """Ranks other than 0 log only warnings and errors: they share one log file."""
    if distributed.process_count() > 1 and not distributed.is_main():
        for handler in logging.getLogger().handlers:
            handler.setLevel(logging.WARNING)


def _write_failure(run_dir: Path, err: Exception):
    """Records an exception as the run's failure in summary.json (its first line, as the reason)."""
    path = run_dir / rundir.SUMMARY
    failure = json.loads(path.read_text()) if path.exists() else {}
    error = f"{type(err).__name__}: {err}".splitlines()[0][:500]
    failure.update(status="failed", error=error, reason=error)
    rundir.write_summary(run_dir, failure)


def _sweep_dir() -> Path | None:
    """The sweep directory of a Hydra multirun; None in a single run or outside Hydra."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    hydra_cfg = HydraConfig.get()
    sweep = Path(hydra_cfg.sweep.dir)
    return sweep if sweep.is_absolute() else Path(hydra_cfg.runtime.cwd) / sweep


def _sweep_job():
    """(sweep directory, job number) of the running multirun job (`init_from: previous` is
    relative to it)."""
    from hydra.core.hydra_config import HydraConfig

    return _sweep_dir(), int(HydraConfig.get().job.num)


def _open_run_dir(run_dir: Path, settings) -> tuple[dict | None, bool]:
    """(the summary of a completed run of this config, or None; whether to resume) for `run_dir`,
    made if missing. Refuses (ConfigError) one that holds another config's run; warns when a run
    is replaced."""
    run_dir.mkdir(parents=True, exist_ok=True)
    done = rundir.completed_summary(run_dir, settings)
    resuming = done is None and rundir.resumable(run_dir, settings)
    if done is not None:
        log.info("already completed (%s); delete it or set resume=false to run again", run_dir / rundir.SUMMARY)
        return done, False
    replaced = rundir.replacing(run_dir, settings)
    if replaced is not None and distributed.is_main():
        log.warning(replaced)
    if not settings.resume and distributed.is_main():  # the earlier run's records are kept, moved aside
        aside = rundir.move_aside(run_dir)
        if aside is not None:
            log.warning("resume=false: moved the earlier run's records and checkpoint into %s", aside)
    if distributed.is_main():
        # no stale summary while this run trains: a resumed run's (stopped "after saving a checkpoint"
        # of an earlier step) would outlive a second Ctrl-C, which exits at once without one
        (run_dir / rundir.SUMMARY).unlink(missing_ok=True)
    return None, resuming


def execute(experiment: Experiment, layout: mesh.Layout, run_dir: Path,
            stop: StopRequest | None = None, tracking: loggers.Tracking | None = None) -> dict:
    """The run: skip, or init or resume; run the task (`runner.lifecycle.loop.run`). Returns the
    summary of a completed run; raises RunFailed for a failed one, RunStopped for a stopped one
    (`ended`).

    `stop` is the caller's installed StopRequest (signals received during the set-up count);
    without one, handlers are installed here. `tracking`: the trackers (TensorBoard, MLflow) that
    also get the params, every unit's record, the summary and the plots.
    """
    settings, wall_start = experiment.settings, time.perf_counter()
    done, resuming = _open_run_dir(run_dir, settings)
    if done is not None:
        return done
    with contextlib.nullcontext(stop) if stop is not None else StopRequest() as stop:
        return ended(loop.run(tasks.of(settings.task), experiment, layout, run_dir, resuming, stop=stop,
                              tracking=tracking, started=wall_start, sweep_dir=_sweep_dir()))


def ended(result: dict) -> dict:
    """A run's summary when it completed; else RunStopped (preempted, interrupted) or RunFailed."""
    if result.get("status") in ("preempted", "interrupted"):
        raise RunStopped(result)
    if result.get("status") == "failed":
        raise RunFailed(result)
    return result
