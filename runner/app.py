"""One VMC run from a composed config: the only module besides the entry point that sees Hydra."""

import contextlib
import functools
import json
import logging
import math
import os
import statistics as pystats
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
from omegaconf import DictConfig, OmegaConf

from runner.config import fingerprint
from runner.config.build import Experiment, build
from runner.core import observe
from runner.core.sampler import ExactSampler, FullSumSampler
from runner.core.vmc import burn_in, estimate, final_burn_in, full_sum_invariance_error, init_state, vmc_step
from runner.diagnostics import health, peaks
from runner.errors import ConfigError
from runner.outputs import loggers
from runner.outputs.plot import plot_energy
from runner.parallel import distributed, mesh
from runner.physics import observables
from runner.physics.exact import ground_energy, wants_exact
from runner.run import checkpoint, hparams_search, sweep_cache, warm_start
from runner.run.preemption import StopRequest, exit_status

log = logging.getLogger(__name__)

METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
CORRELATIONS = "correlations.json"  # with observables: the <Z_i Z_j> matrix and S(q) on every momentum
WARMUP_STEPS = 2  # excluded from seconds_per_iter
EXACT_CACHE = ".exact_cache"  # under a sweep's directory: exact energies shared by its points
EXACT_KEYS = ("hilbert.", "hamiltonian.")  # the config the exact ground energy depends on


def run(cfg: DictConfig, run_dir: str | None = None, new_dirs=frozenset()) -> dict | float:
    """Runs the experiment in `cfg` (see `_run`); under the Optuna sweeper, returns the trial's
    objective instead of the summary: `optimized_metric` of the summary, or a large penalty for a
    failed run (which never raises there: a failed trial must not end the study)."""
    if not _optuna_sweep(run_dir):
        return _run(cfg, run_dir, new_dirs)
    from hydra.core.hydra_config import HydraConfig

    direction = str(HydraConfig.get().sweeper.get("direction", "minimize"))
    metric = str(cfg.get("optimized_metric", "energy"))
    trial_dir = HydraConfig.get().runtime.output_dir
    return hparams_search.run_trial(lambda: _run(cfg, run_dir, new_dirs), trial_dir, metric, direction)


def _optuna_sweep(run_dir) -> bool:
    """Whether this is a job of Hydra's Optuna sweeper (which wants a number back)."""
    from hydra.core.hydra_config import HydraConfig

    if run_dir is not None or not HydraConfig.initialized():
        return False
    return "optuna" in str(HydraConfig.get().sweeper.get("_target_", "")).lower()


def _run(cfg: DictConfig, run_dir: str | None = None, new_dirs=frozenset()) -> dict:
    """Runs the experiment described by `cfg` in `run_dir` (Hydra's output directory).

    `new_dirs`: directories that did not exist when the command started; a single run's config
    error removes its run directory (and new parents) if it is one of them.

    A bad config value prints one sentence and exits with status 2 before anything compiles;
    in a multirun it is recorded as the point's failure (summary.json, status `failed`) and
    the sweep goes on. A stop signal (SIGTERM, SIGUSR2, Ctrl-C) is honoured from the moment the
    config is valid: the run stops at the next step boundary (exit 3, or 130 for Ctrl-C).

    Returns:
        The summary dict (also written to summary.json).
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
        experiment = warm_start.resolve(build(config), config, _sweep_job() if multirun else None)
        try:
            _check_run_dir(run_dir, experiment.settings)
        except ConfigError as err:
            conflict = err
            raise
        distributed.initialize(experiment.parallel, experiment.x64)
        layout = mesh.make_mesh(experiment.parallel["backend"])
        mesh.check_chains(experiment.problem.sampler.n_chains, layout)
        hparams_search.check(config)
        tracking = loggers.setup(config, run_dir, _sweep_dir())  # a missing library is a config error
    except ConfigError as err:
        print(f"Config error: {err.sentence()}", file=sys.stderr)
        if multirun and err is conflict:  # that run's files stay as they are; the sweep goes on
            return {"status": "failed", "reason": f"config error: {err.sentence()}"}
        if multirun:
            return _write_config_failure(run_dir, err)
        if from_hydra:
            _remove_if_new(run_dir, new_dirs)
        sys.exit(2)
    except distributed.DistributedInitError as err:
        print(err, file=sys.stderr)
        sys.exit(1)
    _quiet_other_ranks()
    with StopRequest() as stop:  # before any heavy work (exact energy, compilation)
        log.info("run directory: %s", run_dir.resolve())
        try:
            _header(experiment, layout, config)
            return execute(experiment, layout, run_dir, stop=stop, tracking=tracking)
        except Exception as err:
            # Every rank reports its own failure: launchers often show only rank 0's.
            log.exception("process %d of %d failed", distributed.process_index(), distributed.process_count())
            if _is_writer():
                _write_failure(run_dir, err)
                tracking.close(json.loads((run_dir / SUMMARY).read_text()))
            if distributed.process_count() > 1:
                # Hydra would catch the error and let this task exit 0 while its peers wait in a
                # collective; exiting now lets the launcher (KillOnBadExit) end the step at once.
                logging.shutdown()
                os._exit(1)
            raise


def _describe(group: dict) -> str:
    """`chain(L=8, pbc=True)` from a config group: the constructor and its keys."""
    group = dict(group)
    name = str(group.pop("_target_", group.pop("name", "?"))).rpartition(".")[2]

    def short(value):  # a graph's edge list or a Pauli sum's terms: their length only
        return f"[{len(value)} items]" if isinstance(value, (list, dict)) and len(str(value)) > 60 else value

    return f"{name}(" + ", ".join(f"{k}={short(v)}" for k, v in group.items() if v is not None) + ")"


def _paths(model) -> str:
    """Which evaluation paths the run takes: the model's declared fast paths, or the generic ones."""
    from models.fast_paths import resolve

    paths = resolve(model)
    names = [name for name, on in (("local ratios", paths and paths.ratio),
                                   ("Metropolis cache", paths and paths.amplitude),
                                   ("Jacobian products", paths and paths.jacobian_products)) if on]
    if not names:
        return "generic paths (full evaluations of log psi, autodiff Jacobian products)"
    return "the model's fast paths: " + ", ".join(names)


def _header(experiment: Experiment, layout: mesh.Layout, config: dict):
    """The start-up header: what is about to run, before any heavy work."""
    hilbert, settings = experiment.hilbert, experiment.settings
    sigma_N = jax.ShapeDtypeStruct((hilbert.n_sites,), jnp.int8)
    params = jax.eval_shape(experiment.problem.model.init, jax.random.PRNGKey(0), sigma_N)["params"]
    n_params = sum(x.size for x in jax.tree_util.tree_leaves(params))
    sampler = experiment.problem.sampler
    lines = [
        f"lattice: {_describe(config['hilbert'])}: {hilbert.n_sites} sites, {len(hilbert.bonds)} bonds, "
        f"{len(hilbert.next_bonds)} next bonds, {hilbert.n_states} basis states",
        f"hamiltonian: {_describe(config['hamiltonian'])}",
        f"model: {_describe(config['model'])}: {n_params} parameters; {_paths(experiment.problem.model)}",
        f"sampler: {_describe(config['sampler'])}: {_sample_count(sampler)}",
        f"optimizer: {_describe(config['optimizer'])}; preconditioner: {_describe(config['preconditioner'])}",
        f"dtype: {experiment.dtype_name}; backend: {experiment.parallel['backend']}, "
        f"{distributed.process_count()} process(es), {layout.n_devices} device(s) ({jax.devices()[0].platform})",
        f"steps: {settings.n_iter}, checkpoint every {settings.checkpoint_every}, seed {settings.seed}",
    ]
    for line in lines:
        log.info(line)


def _sample_count(sampler) -> str:
    if isinstance(sampler, FullSumSampler):
        orbits = "" if sampler.symmetry == "none" else f" ({sampler.symmetry} orbits of {sampler.hilbert.n_states})"
        return (f"exact sum over {sampler.n_configurations} configurations{orbits} "
                f"on {sampler.n_chains} rows of {sampler.samples_per_chain}")
    return f"{sampler.n_samples} samples over {sampler.n_chains} chains"


def _remove_if_new(run_dir: Path, new_dirs):
    """Removes a run directory that did not exist before this run and holds only what Hydra wrote
    (`.hydra/` and an empty log, left by a config error), and its parents that did not either.

    Args:
        new_dirs: paths (resolved) that did not exist when the command started (`cli.new_dirs`);
            any other directory (a resumed run's, a user's) stays.
    """
    import shutil

    run_dir = run_dir.resolve()
    try:
        if run_dir not in new_dirs:
            return
        hydra_dir = run_dir / ".hydra"
        hydra_files = {p.name for p in hydra_dir.iterdir()} if hydra_dir.is_dir() else set()
        only_hydra = all(p.name == ".hydra" or (p.suffix == ".log" and p.stat().st_size == 0)
                         for p in run_dir.iterdir())
        if not (only_hydra and hydra_files <= {"config.yaml", "hydra.yaml", "overrides.yaml"}):
            return
        shutil.rmtree(run_dir)
        parent = run_dir.parent  # outputs/DATE of the default outputs/DATE/TIME, when new and empty
        while parent in new_dirs and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent
    except OSError:  # a directory we cannot read or remove is left as it is
        pass


def _write_config_failure(run_dir: Path, err: ConfigError) -> dict:
    """A multirun point with a bad config: recorded as failed so the rest of the sweep runs."""
    summary = {"status": "failed", "reason": f"config error: {err.sentence()}",
               "error": f"ConfigError: {err.sentence()}"}
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _quiet_other_ranks():
    """Ranks other than 0 log only warnings and errors: they share one log file."""
    if distributed.process_count() > 1 and not distributed.is_main():
        for handler in logging.getLogger().handlers:
            handler.setLevel(logging.WARNING)


def _write_failure(run_dir: Path, err: Exception):
    path = run_dir / SUMMARY
    summary = json.loads(path.read_text()) if path.exists() else {}
    error = f"{type(err).__name__}: {err}".splitlines()[0][:500]
    summary.update(status="failed", error=error, reason=error)
    path.write_text(json.dumps(summary, indent=2) + "\n")


def _finite(x):
    x = float(x)
    return x if math.isfinite(x) else None


def _is_writer() -> bool:
    return distributed.is_main()


class MetricsLog:
    """metrics.jsonl, one JSON object per step; truncated to a checkpoint on resume."""

    def __init__(self, path: Path, resume_step: int, started: float):
        self.path = path
        self.started = started
        kept = []
        if resume_step and path.exists() and _is_writer():
            for line in path.read_text().splitlines():
                if line.strip() and json.loads(line)["step"] < resume_step:
                    kept.append(line)
        if _is_writer():
            path.write_text("".join(line + "\n" for line in kept))
        self.records = [json.loads(line) for line in kept]
        self.tracking = None  # loggers.Tracking: every record also goes to the chosen trackers

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def append(self, record: dict):
        self.records.append(record)
        if _is_writer():
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")
            if self.tracking is not None:
                self.tracking.log_metrics(record)


def _check_full_sum(problem, seed):
    """Exit 2 with the sentence when a full sum over orbits does not fit the model (checked on
    the seed's initial parameters and another draw, on this process's default device)."""
    if not isinstance(problem.sampler, FullSumSampler) or problem.sampler.symmetry == "none":
        return
    sigma_N = jnp.ones((problem.sampler.hilbert.n_sites,), jnp.int8)
    draws = [problem.model.init(jax.random.PRNGKey(k), sigma_N)["params"] for k in (seed, seed + 1)]
    error = full_sum_invariance_error(problem, draws)
    if error is not None:
        print(f"Config error: {ConfigError('sampler.symmetry', error).sentence()}", file=sys.stderr)
        sys.exit(2)


def _place_state(problem, settings, layout):
    """Initial state, created directly with its shardings (chains split, rest replicated)."""
    sigma_N = jnp.ones((problem.sampler.hilbert.n_sites,), jnp.int8)
    init = functools.partial(init_state, problem, settings.seed, sigma_N)
    shardings = mesh.shard_state(jax.eval_shape(init), layout)
    return jax.jit(init, out_shardings=shardings)(), shardings


def _restore(run_dir, state, shardings):
    loaded, meta = checkpoint.load(run_dir / "checkpoint", state)
    return mesh.from_host(loaded, shardings), meta


def _progress(n_iter, start):
    """A progress bar on a terminal (tqdm disables itself otherwise)."""
    from tqdm import tqdm

    return tqdm(total=n_iter, initial=start, disable=None, file=sys.stderr, dynamic_ncols=True)


def execute(experiment: Experiment, layout: mesh.Layout, run_dir: Path,
            stop: StopRequest | None = None, tracking: loggers.Tracking | None = None) -> dict:
    """The run loop: init or resume, step, log, checkpoint, estimate, summarise.

    `stop` is the caller's installed StopRequest (signals received during the set-up count);
    without one, handlers are installed from compilation on. `tracking`: the trackers (TensorBoard,
    MLflow) that also get the params, every step's metrics, the summary and the plots.
    """
    settings, problem = experiment.settings, experiment.problem
    wall_start = time.perf_counter()
    run_dir.mkdir(parents=True, exist_ok=True)
    try:  # both refuse a run directory that holds another config's run
        done = _completed_summary(run_dir, settings)
        resuming = done is None and _resumable(run_dir, settings)
    except ConfigError as err:
        print(f"Config error: {err.sentence()}", file=sys.stderr)
        sys.exit(2)
    if done is not None:
        log.info("already completed (%s); delete it or set resume=false to run again", run_dir / SUMMARY)
        return done
    if not resuming and _is_writer():
        (run_dir / SUMMARY).unlink(missing_ok=True)  # starting over: no stale summary of another run

    exact_energy = _exact_energy(experiment)
    _check_full_sum(problem, settings.seed)

    state, shardings = _place_state(problem, settings, layout)
    if not resuming:  # a warm start (init_from) replaces the initial parameters (and chains)
        state = warm_start.warm_start(experiment, state, shardings)
    n_params = sum(x.size for x in jax.tree_util.tree_leaves(state.params))
    start = 0
    if resuming:
        try:
            state, meta = _restore(run_dir, state, shardings)
        except ValueError as err:
            print(f"Config error: resume found a checkpoint that does not fit this config ({err}); "
                  "use a new run directory or resume=false.", file=sys.stderr)
            sys.exit(2)
        start = int(meta["step"])
        log.info("resumed from checkpoint at step %d", start)
    metrics_log = MetricsLog(run_dir / METRICS, start, started=wall_start)
    if tracking is not None:
        metrics_log.tracking = tracking.open(start)

    with contextlib.nullcontext(stop) if stop is not None else StopRequest() as stop:
        compile_seconds, step_times, final, peak_check = None, [], {}, None
        observed = None  # with observables: (summary fields, correlations.json)
        if stop.requested():  # during the set-up: nothing to compile
            status, reason = _stopped_before_first_step(stop)
        else:
            t = time.perf_counter()
            # Under the mesh, dense SR gathers Obar onto every device and forms the Gram matrix
            # in one product (runner/core/precond.py): bitwise equal on every layout, and as fast as
            # the layout-dependent product.
            with mesh.activate(layout):
                step_fn = (
                    jax.jit(
                        functools.partial(vmc_step, problem,
                                          observe=observe.step_observer(experiment.observables, problem)),
                        in_shardings=(shardings,),
                        out_shardings=(shardings, layout.replicated),
                    )
                    .lower(state)
                    .compile()
                )
            compile_seconds = time.perf_counter() - t
            restart = _chain_restarter(problem, settings, shardings) if settings.peak_restart_every else None
            state, status, reason, step_times = _optimize(step_fn, state, start, settings, run_dir,
                                                          metrics_log, stop, restart)
        if status == "completed":
            _save(run_dir, state, _checkpoint_meta(settings, settings.n_iter))
            if experiment.observables is None:
                est = jax.jit(_burnt_in(problem, functools.partial(estimate, problem, n_rounds=settings.final_rounds)),
                              in_shardings=(shardings,), out_shardings=(shardings.chains, layout.replicated))
                final = {k: _finite(v) for k, v in mesh.to_host(est(state)[1]).items()}
            else:
                final, observed = _estimate_with_observables(experiment, state, shardings, layout)
            peak_check = _peak_check(problem, settings, state, final)

        timed = step_times[WARMUP_STEPS:] or step_times
        summary = _summary(experiment, layout, status, final, exact_energy, n_params,
                           pystats.median(timed) if timed else None, compile_seconds,
                           step_times[0] if step_times else None,
                           time.perf_counter() - wall_start, metrics_log.records)
        summary["reason"] = reason
        summary["peak_check"] = peak_check
        summary["final_burn_in"] = final_burn_in(problem.sampler) if status == "completed" else None
        summary.update(observed[0] if observed else {})
        fingerprint.stamp(summary, settings.fingerprint)
        # judged on completed runs only: a stopped run has no final estimate to judge
        summary["warnings"] = health.check(summary, metrics_log.records,
                                           metropolis=not isinstance(problem.sampler, (ExactSampler, FullSumSampler)),
                                           cg_maxiter=_cg_maxiter(problem)) if status == "completed" else []
        if _is_writer():
            (run_dir / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")
            plot_energy(metrics_log.records, exact_energy, run_dir / "energy.png")
            if observed:
                (run_dir / CORRELATIONS).write_text(json.dumps(observed[1]) + "\n")
            if tracking is not None:
                tracking.close(summary)  # after the plots: they are artifacts
        _report(summary)
        if status in ("preempted", "interrupted"):
            stop.hand_over()  # under submitit: requeues the job (and exits)
    if status == "failed":
        sys.exit(1)
    if status in ("preempted", "interrupted"):
        sys.exit(exit_status(status))
    return summary


def _burnt_in(problem, estimate_fn):
    """`estimate_fn` (state -> (chains, metrics)) after the final estimate's burn-in
    (`runner.core.vmc.final_burn_in`: chains that sampled |psi|^p, p != 2, in training)."""
    sweeps = final_burn_in(problem.sampler)
    return lambda state: estimate_fn(burn_in(problem, state, sweeps))


def _estimate_with_observables(experiment, state, shardings, layout):
    """The final energy and the observables from the same fresh samples.

    Returns:
        (final energy metrics, (summary fields, correlations.json)).
    """
    problem, settings, obs = experiment.problem, experiment.settings, experiment.observables
    fn = functools.partial(observe.estimate, problem, obs, n_rounds=settings.final_rounds)
    est = jax.jit(_burnt_in(problem, fn),
                  in_shardings=(shardings,), out_shardings=(shardings.chains, layout.replicated))
    energy, measured = mesh.to_host(est(state)[1])
    n_per_chain = settings.final_rounds * problem.sampler.n_samples // problem.sampler.n_chains
    fields, correlations = observables.results(obs, measured, n_per_chain)
    for name, value in fields["observables"].items():
        if value["mean"] is not None:
            log.info("%s: %.8f ± %.2e", name, value["mean"], float("nan") if value["error"] is None else value["error"])
    return {k: _finite(v) for k, v in energy.items()}, (fields, correlations)


def _peak_check(problem, settings, state, final):
    """`runner.diagnostics.peaks.check` at the final parameters, from the chains' last configurations and
    `peak_search` uniform ones; None after a full sum (no sample to miss anything) or with
    peak_search=0. Every process runs the same search on its own default device."""
    if final.get("log_abs_max") is None or settings.peak_search == 0:  # before the collective below
        return None
    params, sigma_CxN = mesh.to_host((state.params, state.chains.sigma_CxN))  # a collective
    result = peaks.check_estimate(problem, params, final, sigma_CxN, settings.peak_search, settings.seed)
    log.info("peak search (%s): largest |psi|^2 found e^%.1f times the samples' largest", result["method"],
             result["log_ratio"])
    return result


def _chain_restarter(problem, settings, shardings):
    """(state, step) -> (state, {"peak_log_ratio"}): chain number (step / peak_restart_every) mod C
    moved to the largest |psi| that `runner.diagnostics.peaks` finds from the chains' configurations and
    `peak_search` uniform ones (drawn from the seed and the step), and the log of its |psi|^2 over
    the chains' largest. Every process runs the same search; the chain is set in the global array."""
    at = peaks.log_abs_evaluator(problem)
    set_chain = jax.jit(lambda chains, c, sigma_N: chains._replace(sigma_CxN=chains.sigma_CxN.at[c].set(sigma_N)),
                        out_shardings=shardings.chains)

    def restart(state, step):
        params, sigma_CxN = mesh.to_host((state.params, state.chains.sigma_CxN))  # a collective
        sigma_N, log_ratio = peaks.restart_target(at(params), problem.sampler.hilbert, sigma_CxN,
                                                  settings.peak_search, settings.seed, step)
        c = (step // settings.peak_restart_every) % len(sigma_CxN)
        return state._replace(chains=set_chain(state.chains, c, sigma_N)), {"peak_log_ratio": log_ratio}

    return restart


def _stopped_before_first_step(stop: StopRequest) -> tuple[str, str]:
    """Status and reason of a run stopped before its first step: no new checkpoint (the one
    that exists, if any, is still this run's latest state)."""
    reason = f"{stop.describe()} received before the first step"
    log.warning("%s; stopping", reason)
    return stop.status, reason


def _cg_maxiter(problem) -> int | None:
    """The SR solver's CG iteration limit (None without CG): the health check's reference."""
    update = problem.precondition.update
    keywords = getattr(update, "keywords", {})  # sr() binds its settings with functools.partial
    return keywords.get("maxiter") if keywords.get("solver") in ("cg", "auto") else None


def _checkpoint_meta(settings, step):
    return {"step": step, "seed": settings.seed, "config_fingerprint": fingerprint.record(settings.fingerprint)}


# a step whose energy, or its variance or error bar, is not finite (None in its record) stops the run:
# a finite mean of local energies whose variance overflowed is no energy either
GUARDED = ("energy", "variance", "energy_error")


def _unusable(record) -> list:
    """The `GUARDED` keys of a metrics record that `_finite` made None."""
    return [k for k in GUARDED if k in record and record[k] is None]


def _non_finite_reason(metrics, unusable, step) -> str:
    """Why a step's estimate is unusable, from its raw `metrics` and `_unusable` keys."""
    if "energy" in unusable:
        return f"energy is {float(metrics['energy'])} at step {step}"
    spread = ", ".join(f"{k} {float(metrics[k])}" for k in unusable)
    return f"energy is {float(metrics['energy']):.6g} with {spread} at step {step}"


def _optimize(step_fn, state, start, settings, run_dir, metrics_log, stop, restart=None):
    """Steps from `start` to `n_iter`, logging metrics and checkpointing.

    Stops early on a non-finite energy, variance or error ("failed", the state of the last step is dropped;
    not on a step that `reject_jump` rejected, whose parameters are dropped anyway)
    or a stop signal ("preempted", or "interrupted" for Ctrl-C, after saving a checkpoint at
    the current step). With `restart` ((state, step) -> (state, metrics), `_chain_restarter`),
    the state after every `peak_restart_every`-th step is restarted before the next step and
    before any checkpoint of that step, so a resumed run continues exactly.

    Returns:
        (state, status, reason, step_times); `reason` says why a run did not complete (None if it did).
    """
    status, reason, step_times = "completed", None, []
    # the step of the newest checkpoint this run can fall back on (a resumed run's is `start`)
    last_good = start if start > 0 else None
    bar = _progress(settings.n_iter, start)
    log_every = max(1, settings.n_iter // 10)
    # Metrics are read one step late: step k+1 is dispatched before step k's metrics are
    # fetched, so the device never waits for logging. (No buffer donation: the state of
    # step k stays valid for a checkpoint while step k+1 runs.)
    if start < settings.n_iter and stop.requested():  # during compilation
        bar.close()
        return (state, *_stopped_before_first_step(stop), step_times)
    pending = step_fn(state) if start < settings.n_iter else None
    t = time.perf_counter()
    for step in range(start, settings.n_iter):
        new_state, metrics = pending
        restart_now = restart is not None and (step + 1) % settings.peak_restart_every == 0
        if step + 1 < settings.n_iter and not restart_now:
            pending = step_fn(new_state)
        metrics = mesh.to_host(metrics)
        now = time.perf_counter()
        step_times.append(now - t)
        t = now
        record = {"step": step, **{k: _finite(v) for k, v in metrics.items()}}
        record["wall_time"] = metrics_log.elapsed()
        record = observables.keep_measured(record)  # obs/ fields only at the steps that measured
        unusable = _unusable(record)
        # reject_jump undid a step whose estimate is unusable: the next step measures the kept state
        failed = bool(unusable) and not record.get("rejected")
        if restart_now and not failed:
            new_state, found = restart(new_state, step + 1)
            record.update(found)
            if step + 1 < settings.n_iter:
                pending = step_fn(new_state)
        metrics_log.append(record)
        if failed:
            status, reason = "failed", _non_finite_reason(metrics, unusable, step)
            kept = (f"the last good checkpoint is step {last_good}" if last_good is not None
                    else "no checkpoint was written (the run starts over when run again)")
            log.error("%s; stopping, %s", reason, kept)
            break
        state = new_state
        bar.update(1)
        if unusable:
            log.warning("%s; rejected (reject_jump): the next step measures the kept parameters again",
                        _non_finite_reason(metrics, unusable, step))
        else:
            bar.set_postfix_str(f"E={record['energy']:.6f}±{record['energy_error']:.1e} "
                                f"acc={record['acceptance']:.2f}")
            if (step + 1) % log_every == 0:
                log.info("step %d  E = %.8f ± %.2e  var %.3e  acc %.2f", step + 1, record["energy"],
                         record["energy_error"], record["variance"], record["acceptance"])
        if step + 1 == settings.n_iter:
            break
        if stop.requested():
            status = stop.status
            reason = f"{stop.describe()} received; stopped at step {step + 1} after saving a checkpoint"
            log.warning("%s received: saving a checkpoint at step %d", stop.describe(), step + 1)
            _save(run_dir, state, _checkpoint_meta(settings, step + 1))
            break
        if (step + 1) % settings.checkpoint_every == 0:
            _save(run_dir, state, _checkpoint_meta(settings, step + 1))
            last_good = step + 1
    bar.close()
    return state, status, reason, step_times


def _completed_summary(run_dir, settings):
    """The summary of a finished run of the same length and config (final_rounds included).

    Anything else is None: the checkpoint then decides (`_resumable`), so a finished run with
    another config is refused there, and one with another n_iter or final_rounds continues.
    """
    path = run_dir / SUMMARY
    if not (settings.resume and path.exists() and checkpoint.exists(run_dir / "checkpoint")):
        return None
    try:
        summary = json.loads(path.read_text())
    except ValueError:  # cut short: not a finished run's
        return None
    stored = summary.get("config_fingerprint")
    if (summary.get("status") == "completed" and summary.get("n_iter") == settings.n_iter
            and fingerprint.same(stored, settings.fingerprint)):
        return summary
    return None


def _check_run_dir(run_dir, settings):
    """Refuses, before any heavy work, a run directory holding another config's run (the same
    checks as `execute`'s skip and resume)."""
    if _completed_summary(run_dir, settings) is None:
        _resumable(run_dir, settings)


def _resumable(run_dir, settings) -> bool:
    """Whether to resume from run_dir/checkpoint: resume is on and a checkpoint exists.

    Raises:
        ConfigError: the checkpoint belongs to a config that differs in a key that changes the
            numbers (final_rounds may differ), or predates config fingerprints.
    """
    if not (settings.resume and checkpoint.exists(run_dir / "checkpoint")):
        return False
    meta = checkpoint.read_meta(run_dir / "checkpoint")
    fingerprint.check(meta.get("config_fingerprint"), settings.fingerprint, run_dir,
                      ignore=fingerprint.RESUME_IGNORES)
    return True


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


def _exact_energy(experiment):
    """The exact ground energy when the `exact` knob asks for it, else None.

    Computed on process 0 only and broadcast to the others. In a sweep, process 0 first looks
    in SWEEP_DIR/.exact_cache for the energy of the same lattice and Hamiltonian (computed by
    an earlier point) and stores what it computes there.
    """
    settings = experiment.settings
    if not wants_exact(settings.exact, experiment.hilbert):
        return None
    energy = 0.0
    if distributed.is_main():
        key = {k: v for k, v in settings.fingerprint.items() if k.startswith(EXACT_KEYS)}
        sweep = _sweep_dir()
        cache = sweep / EXACT_CACHE if sweep is not None else None
        cached = sweep_cache.read(cache, key) if cache is not None else None
        if isinstance(cached, (int, float)):
            energy = float(cached)
            log.info("exact ground energy %.10f (from the sweep cache %s)", energy, sweep_cache.path(cache, key))
        else:
            t = time.perf_counter()
            energy = ground_energy(experiment.hamiltonian, experiment.hilbert)
            log.info("exact ground energy %.10f (computed in %.1f s)", energy, time.perf_counter() - t)
            if cache is not None:
                sweep_cache.write(cache, key, energy)
    if distributed.process_count() > 1:
        energy = distributed.broadcast_float(energy)
    return energy


def _save(run_dir, state, meta):
    host_state = mesh.to_host(state)  # a collective: every process takes part
    if _is_writer():
        checkpoint.save(run_dir / "checkpoint", host_state, meta)


def _summary(experiment, layout, status, final, exact_energy, n_params, seconds_per_iter,
             compile_seconds, first_step_seconds, wall_seconds, records):
    sampler = experiment.problem.sampler
    energy = final.get("energy")
    variance = final.get("variance")
    n_sites = experiment.hilbert.n_sites
    v_score = n_sites * variance / energy**2 if energy and variance is not None else None
    rel = abs(energy - exact_energy) / abs(exact_energy) if energy is not None and exact_energy else None
    return {
        "status": status,
        "energy": energy,
        "energy_error": final.get("energy_error"),
        "variance": variance,
        "v_score": v_score,
        "r_hat": final.get("r_hat"),
        "tau_corr": final.get("tau_corr"),
        "acceptance": final.get("acceptance"),
        "exact_energy": exact_energy,
        "relative_error": rel,
        "n_iter": experiment.settings.n_iter,
        "steps_done": len(records),
        "n_params": int(n_params),
        "n_sites": n_sites,
        "n_samples": sampler.n_samples,
        "n_chains": sampler.n_chains,
        "dtype": experiment.dtype_name,
        "seed": experiment.settings.seed,
        "backend": experiment.parallel["backend"],
        "processes": distributed.process_count(),
        "devices": layout.n_devices,
        "seconds_per_iter": seconds_per_iter,
        "compile_seconds": compile_seconds,
        "first_step_seconds": first_step_seconds,
        "wall_seconds": wall_seconds,
    }


def _report(summary):
    lines = [f"status: {summary['status']}"]
    if summary["energy"] is not None:
        lines.append(f"energy: {summary['energy']:.10f} ± {summary['energy_error']:.2e}  (V-score {summary['v_score']:.2e})")
    if summary["exact_energy"] is not None:
        lines.append(f"exact:  {summary['exact_energy']:.10f}")
    if summary["relative_error"] is not None:
        lines.append(f"relative error: {summary['relative_error']:.2e}")
    if summary["seconds_per_iter"] is not None:
        lines.append(f"time per iteration: {1e3 * summary['seconds_per_iter']:.2f} ms; compile {summary['compile_seconds']:.2f} s; wall {summary['wall_seconds']:.1f} s")
    for line in lines:
        log.info(line)
    if summary.get("reason"):
        log.warning("%s: %s", summary["status"], summary["reason"])
    for warning in summary.get("warnings", []):
        log.warning("health warning [%s]: %s", warning["name"], warning["message"])
