"""A time evolution (task=dynamics): the TDVP integrated from the initial state to t_end under the
run's Hamiltonian, measured at every saved time (trajectory.jsonl), checkpointed there, compared
with the exact dynamics where the space allows, and summarised."""

import contextlib
import functools
import json
import logging
import time
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from runner.config import fingerprint
from runner.config.task import Dynamics
from runner.core import integrators, observe
from runner.core.full_sum import FullSumSampler
from runner.core.problem import draw, sums_exactly
from runner.core.sampler import init_chains, random_state
from runner.core.tdvp import DynamicsState, parameter_derivative, start, time_derivative
from runner.diagnostics import health
from runner.errors import ConfigError
from runner.lifecycle import checkpoint, loop, rundir, warm_start
from runner.lifecycle.dynamics_exact import exact_trajectory, max_abs_errors
from runner.lifecycle.preemption import StopRequest
from runner.outputs import trajectory_plot
from runner.outputs.summary import energy_unit, finite, layout_fields, log_warnings, per_site
from runner.parallel import distributed, mesh
from runner.physics.observables import ERROR_PREFIX, PREFIX

log = logging.getLogger(__name__)

UNIFORM_TOLERANCE = 1e-12  # plus_x: how far log psi may vary over the probed configurations
N_PROBES = 16  # plus_x: configurations on which log psi must be constant
STEPS_PER_CALL = 16  # integrator steps per call of the compiled advance: a stop signal waits for at most these
MAX_STEPS = 100_000  # integrator attempts between two saved times before the run fails


class Initial(NamedTuple):
    """The state a time evolution starts from (the shape `warm_start.warm_start` replaces)."""

    params: Any
    chains: Any


def _plus_x_params(problem, seed: int):
    """The model's parameters (shapes from the seed's initialisation), every one zero."""
    sigma_N = jnp.ones((problem.sampler.hilbert.n_sites,), jnp.int8)
    params = problem.model.init(jax.random.PRNGKey(seed), sigma_N)["params"]
    return jax.tree_util.tree_map(jnp.zeros_like, params)


def _probes(hilbert, seed: int):
    """N_PROBES uniformly random configurations of the space (in its Sz sector, if any) [K, N]."""
    keys = jax.random.split(jax.random.PRNGKey(seed), N_PROBES)
    return jax.vmap(functools.partial(random_state, hilbert))(keys)


def check(experiment):
    """Refuses, before anything compiles, `initial_state: plus_x` for a model that does not give a
    uniform psi when every parameter is zero (log psi checked on a handful of configurations), and
    `initial_state: init_from` when no run was found to start from.

    Raises:
        ConfigError: naming the model.
    """
    task = experiment.settings.task
    if not isinstance(task, Dynamics):
        return
    if task.initial_state == "init_from" and experiment.settings.init_from is None:
        raise ConfigError("task.initial_state", "is init_from, and init_from names no run to start from (previous in "
                                                "a sweep's first job); use initial_state=plus_x there")
    if task.initial_state != "plus_x":
        return
    problem = experiment.problem
    params = _plus_x_params(problem, experiment.settings.seed)
    logpsi_K = np.asarray(jax.jit(problem.logpsi)(params, _probes(experiment.hilbert, 0)))
    name = type(problem.model).__name__
    if not np.all(np.isfinite(logpsi_K)):
        raise ConfigError("task.initial_state", f"is plus_x, which the model {name} cannot represent: with every "
                                                "parameter zero psi vanishes (log psi not finite); use "
                                                "initial_state=init_from")
    spread = float(np.max(np.abs(logpsi_K - logpsi_K[0])))
    if spread > UNIFORM_TOLERANCE * max(1.0, float(np.abs(logpsi_K[0]))):
        raise ConfigError("task.initial_state", f"is plus_x, which the model {name} cannot represent: with every "
                                                f"parameter zero its log psi varies by {spread:.3g} over "
                                                "configurations; use initial_state=init_from")


def draw_rounds(problem, params, chains, rounds: int):
    """`draw`'s (chains, sigma [C, R T, N], w, acceptance) of `rounds` consecutive draws, each
    chain's rounds joined into one longer chain (so error bars see their correlation); one draw
    for rounds 1 or a full sum (more would repeat it)."""
    if rounds == 1 or sums_exactly(problem):
        return draw(problem, params, chains)

    def one(chains, _):
        chains, sigma_CxTxN, w_CxT, acceptance = draw(problem, params, chains)
        return chains, (sigma_CxTxN, w_CxT, acceptance)

    chains, (sigma_RxCxTxN, w_RxCxT, acceptance_R) = jax.lax.scan(one, chains, length=rounds)
    join = lambda x: jnp.moveaxis(x, 0, 1).reshape(x.shape[1], -1, *x.shape[3:])  # noqa: E731
    return chains, join(sigma_RxCxTxN), None if w_RxCxT is None else join(w_RxCxT), jnp.mean(acceptance_R)


def measure(problem, equation, obs, params, chains, rounds: int = 1):
    """(chains, metrics) at the current parameters: energy, its error, the TDVP residual and the
    observables from `rounds` draws of samples (`draw_rounds`; a full sum's: exact), the chains
    advanced by them."""
    chains, sigma_CxTxN, w_CxT, acceptance = draw_rounds(problem, params, chains, rounds)
    _, info = parameter_derivative(problem, equation, params, sigma_CxTxN, w_CxT)
    out = {"energy": jnp.real(info.energy.mean), "energy_error": info.energy.error_of_mean,
           "residual": info.residual, "acceptance": acceptance}
    if obs is not None:
        full_sum = isinstance(problem.sampler, FullSumSampler)
        if full_sum and problem.sampler.symmetry != "none":  # observables differ between an orbit's members
            sigma_CxTxN, w_CxT = observe.every_configuration(problem.sampler, problem.amplitude, params)
        measured = observe.measure(obs, observe.local_values(obs, problem, params, sigma_CxTxN), w_CxT, exact=full_sum)
        for name in obs.all_names:
            out[f"obs/{name}"] = measured[PREFIX + name]
            out[f"obs/{name}_error"] = measured[ERROR_PREFIX + name]
    return chains, out


class Compiled(NamedTuple):
    """The compiled pieces of a time evolution (each compiled once for the whole run)."""

    begin: Any  # (params, chains) -> DynamicsState at t = 0
    advance: Any  # (DynamicsState, t_end) -> DynamicsState after at most STEPS_PER_CALL steps towards t_end
    measure: Any  # DynamicsState -> (DynamicsState with advanced chains, metrics)
    shardings: Any  # of a DynamicsState


def compile_run(experiment, layout, initial: Initial, initial_shardings) -> Compiled:
    """Compiles the start, the advance to a (traced) end time and the measurement for `layout`."""
    problem, task = experiment.problem, experiment.settings.task
    f = time_derivative(problem, task.equation)
    integrator = task.integrator

    def begin(params, chains):
        return start(integrator, f, params, chains)

    def advance(state, t_end):
        return DynamicsState(*integrators.advance(integrator, f, state.params, state.integrator, t_end,
                                                  max_steps=STEPS_PER_CALL))

    def measured(state):
        chains, metrics = measure(problem, task.equation, experiment.observables, state.params, state.integrator.carry,
                                  task.measure_rounds)
        return state._replace(integrator=state.integrator._replace(carry=chains)), metrics

    with mesh.activate(layout):
        shape = jax.eval_shape(begin, *initial)
        shardings = mesh.shard_state(shape, layout, chain_paths=("carry",))
        begin_c = jax.jit(begin, in_shardings=tuple(initial_shardings), out_shardings=shardings).lower(*initial).compile()
        t_end = jax.ShapeDtypeStruct((), shape.integrator.t.dtype)
        advance_c = jax.jit(advance, in_shardings=(shardings, layout.replicated), out_shardings=shardings) \
            .lower(shape, t_end).compile()
        measure_c = jax.jit(measured, in_shardings=(shardings,), out_shardings=(shardings, layout.replicated)) \
            .lower(shape).compile()
    return Compiled(begin_c, advance_c, measure_c, shardings)


def _initial(experiment, layout) -> tuple[Initial, Initial]:
    """(the initial parameters and chains, their shardings): plus_x (every parameter zero) or the
    init_from run's parameters (and chains with init_chains)."""
    problem, seed = experiment.problem, experiment.settings.seed

    def fresh():
        return Initial(_plus_x_params(problem, seed), init_chains(problem.sampler, seed))

    shardings = mesh.shard_state(jax.eval_shape(fresh), layout)
    with mesh.activate(layout):
        initial = jax.jit(fresh, out_shardings=shardings)()
    return warm_start.warm_start(experiment, initial, shardings), shardings


def _save(run_dir: Path, state, settings, index: int):
    """Checkpoints the state at saved time `index` (`loop.save_checkpoint`, with t in its meta)."""
    loop.save_checkpoint(run_dir, state, settings, index, t=float(mesh.to_host(state.integrator.t)))


def _restore(run_dir: Path, like, shardings):
    """(state, saved index) of run_dir's checkpoint (`loop.restore`: ConfigError when it does not fit)."""
    state, meta = loop.restore(run_dir, mesh.to_host(like), shardings)
    return state, int(meta["step"])


class Trajectory:
    """trajectory.jsonl, one JSON object per saved time; cut back to a checkpoint on resume."""

    def __init__(self, path: Path, kept: int):
        self.path = path
        lines = path.read_text().splitlines() if kept and path.exists() else []
        self.records = [json.loads(line) for line in lines if line.strip()][:kept]
        if distributed.is_main():
            path.write_text("".join(json.dumps(r) + "\n" for r in self.records))

    def append(self, record: dict):
        self.records.append(record)
        if distributed.is_main():
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")


def _record(state, metrics: dict, wall_time: float) -> dict:
    host = mesh.to_host((state.integrator.t, state.integrator.dt, state.integrator.n_accepted,
                         state.integrator.n_rejected, metrics))
    t, dt, accepted, rejected, metrics = host
    return {"t": float(t), **{k: finite(v) for k, v in metrics.items()}, "dt": float(dt),
            "n_steps": int(accepted), "n_rejected": int(rejected), "wall_time": wall_time}


def advance_to(compiled: Compiled, state, t: float, stop: StopRequest):
    """(state at saved time `t`, False), by calls of the compiled advance of at most STEPS_PER_CALL
    integrator steps each, looking for a stop signal between calls; (the state reached, True) once
    one came first. The calls' steps are the steps of one advance to `t`: where a run stops changes
    none of its numbers. After MAX_STEPS attempts t may not be reached (the caller says so)."""
    target = jnp.asarray(t, state.integrator.t.dtype)
    for _ in range(MAX_STEPS // STEPS_PER_CALL):
        state = compiled.advance(state, target)
        if float(state.integrator.t) >= t:
            return state, False
        if stop.requested():
            return state, True
    return state, False


def integrate(compiled: Compiled, state, start: int, times, *, run_dir: Path, settings, trajectory: Trajectory,
              stop: StopRequest, started: float):
    """From saved time `start` on (0: the initial state; resumed: the one after the checkpoint's),
    advances to each saved time, measures there and checkpoints. Returns (state, status, reason)."""
    for index in range(start, len(times)):
        stopped = False
        if index > 0:
            state, stopped = advance_to(compiled, state, times[index], stop)
        if stopped:  # between saved times: the checkpoint of `index - 1` then holds this state
            _save(run_dir, state, settings, index - 1)
            stop.checkpoint_saved(index - 1)
            return state, stop.status, (f"{stop.describe()} received; stopped at t = {float(state.integrator.t):.6g} "
                                        "between saved times after saving a checkpoint")
        if float(state.integrator.t) < times[index]:
            return state, "failed", f"the integrator stopped at t = {float(state.integrator.t):.6g} before {times[index]}"
        state, metrics = compiled.measure(state)
        record = _record(state, metrics, time.perf_counter() - started)
        trajectory.append(record)
        if record["energy"] is None or record["energy_error"] is None:
            return state, "failed", f"energy is not finite at t = {record['t']:.6g}"
        _save(run_dir, state, settings, index)
        log.info("t = %.4f  E = %.8f ± %.2e  residual %.2e  dt %.3g", record["t"], record["energy"],
                 record["energy_error"], record["residual"], record["dt"])
        if index + 1 < len(times) and stop.requested():
            stop.checkpoint_saved(index)
            return state, stop.status, f"{stop.describe()} received; stopped at t = {record['t']:.6g} after saving a checkpoint"
    return state, "completed", None


def _summary(experiment, status, reason, state, records, *, errors, seconds: dict, layout) -> dict:
    task = experiment.settings.task
    summary = {"task": "dynamics", "status": status, "reason": reason,
               "t_reached": records[-1]["t"] if records else None, "t_end": task.t_end,
               "n_saved": len(records), "n_steps": int(state.integrator.n_accepted),
               "n_rejected": int(state.integrator.n_rejected), "seed": experiment.settings.seed,
               "n_sites": experiment.hilbert.n_sites, **layout_fields(experiment, layout), **seconds}
    if records:
        summary.update({k: v for k, v in records[-1].items() if k.startswith(("energy", "obs/", "residual"))})
    n_sites = experiment.hilbert.n_sites  # per site and the unit, as a ground-state summary's (summary.UNIT_FIELDS)
    summary["energy_per_site"] = per_site(summary.get("energy"), n_sites)
    summary["energy_error_per_site"] = per_site(summary.get("energy_error"), n_sites)
    summary["energy_unit"] = energy_unit(experiment.settings.fingerprint.get("hamiltonian._target_"))
    if errors is not None:
        summary["max_abs_error"] = errors
    fingerprint.stamp(summary, experiment.settings.fingerprint)
    summary["warnings"] = []  # judged on completed runs only, as a ground-state run's
    if status == "completed":
        summary["warnings"] = health.check_dynamics(records, real_time=task.real_time,
                                                    metropolis=health.metropolis(experiment.problem.sampler))
    return summary


def final_line(summary: dict) -> str:
    """The run's last log line: how it ended, its last energy (total and per site, in its unit) and
    its largest |error| against the exact dynamics."""
    line = f"dynamics {summary['status']} at t = {summary['t_reached']}"
    if summary.get("energy") is not None:
        error = summary.get("energy_error")
        pm = lambda scale: f" ± {error / scale:.2e}" if error is not None else ""
        line += (f"; energy {summary['energy']:.10f}{pm(1)} (energy/N = {summary['energy_per_site']:.10f}"
                 f"{pm(summary['n_sites'])}) in {summary['energy_unit']}")
    return f"{line}; max |error| against exact: {summary.get('max_abs_error')}"


def execute(experiment, layout, run_dir: Path, resuming: bool, stop: StopRequest | None = None, *, tracking=None,
            started: float | None = None) -> dict:
    """The time evolution in `run_dir` (fresh, or resumed from its checkpoint): trajectory.jsonl,
    exact_trajectory.json, dynamics.png and summary.json. The summary is returned whatever the
    status (`runner.app.ended` raises for a failed or stopped run). `stop`: the caller's installed StopRequest; without one, handlers are installed
    here."""
    with contextlib.nullcontext(stop) if stop is not None else StopRequest() as stop:
        return _execute(experiment, layout, run_dir, resuming, stop=stop, tracking=tracking,
                        started=time.perf_counter() if started is None else started)


def _execute(experiment, layout, run_dir: Path, resuming: bool, *, stop: StopRequest, tracking, started: float) -> dict:
    settings, task = experiment.settings, experiment.settings.task
    times = task.save_times()
    initial, initial_shardings = _initial(experiment, layout)
    t = time.perf_counter()
    compiled = compile_run(experiment, layout, initial, initial_shardings)
    compile_seconds = time.perf_counter() - t
    state, start = compiled.begin(*initial), 0
    if resuming:
        state, index = _restore(run_dir, state, compiled.shardings)
        start = index + 1
        log.info("resumed from the checkpoint at t = %.6g", float(state.integrator.t))
    trajectory = Trajectory(run_dir / rundir.TRAJECTORY, start)
    exact = exact_trajectory(experiment, mesh.to_host(initial.params), times)
    if stop.requested():
        status, reason = stop.status, f"{stop.describe()} received before the first saved time"
    else:
        state, status, reason = integrate(compiled, state, start, times, run_dir=run_dir, settings=settings,
                                          trajectory=trajectory, stop=stop, started=started)
    records = trajectory.records
    errors = max_abs_errors(records, exact)
    result = _summary(experiment, status, reason, state, records, errors=errors, layout=layout,
                      seconds={"compile_seconds": compile_seconds, "wall_seconds": time.perf_counter() - started})
    if distributed.is_main():
        if exact is not None:
            checkpoint.write_atomic(run_dir / rundir.EXACT_TRAJECTORY, lambda f: f.write(json.dumps(exact).encode()))
        trajectory_plot.plot_trajectory(records, exact, run_dir / rundir.DYNAMICS_PLOT, unit=result["energy_unit"])
        (run_dir / rundir.SUMMARY).write_text(json.dumps(result, indent=2) + "\n")
        if tracking is not None:
            tracking.close(result)
    log.info(final_line(result))
    log_warnings(result)
    if status in ("preempted", "interrupted"):
        stop.hand_over()
    return result
