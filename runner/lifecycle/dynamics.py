"""A time evolution (task=dynamics): the TDVP integrated (or projected tVMC's steps taken) from the
initial state to t_end under the run's Hamiltonian, measured at every saved time (trajectory.jsonl),
checkpointed there, compared with the exact dynamics where the space allows, and summarised."""

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
from runner.core import integrators, observe, ptvmc
from runner.core.full_sum import FullSumSampler
from runner.core.estimate import draw_rounds
from runner.core.sampler import init_chains, random_state
from runner.core.tdvp import DynamicsState, parameter_derivative, start, time_derivative
from runner.diagnostics import health
from runner.errors import ConfigError
from runner.lifecycle import checkpoint, loop, programs, rundir, warm_start
from runner.lifecycle.dynamics_exact import exact_trajectory, max_abs_errors
from runner.lifecycle.preemption import StopRequest
from runner.outputs import trajectory_plot
from runner.outputs.summary import energy_unit, finite, layout_fields, log_warnings, per_site
from runner.parallel import mesh
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
    """The model's `plus_x` parameters from the seed's initialisation: psi uniform, and a tangent
    space that holds the quench's two-body response (docs/dynamics.md).

    Raises:
        ConfigError (task.initial_state): a model without `plus_x`.
    """
    model = problem.model
    if not callable(getattr(model, "plus_x", None)):
        raise ConfigError("task.initial_state", f"is plus_x, which the model {type(model).__name__} cannot represent "
                                                "with a tangent space that moves: at a uniform state its "
                                                "log-derivatives miss the two-body terms of the quench, so <X>(t) "
                                                "would stay frozen; use a model that has one (jastrow, rbm, "
                                                "rbm_symm, mlp, cnn, gcnn) or initial_state=init_from")
    sigma_N = jnp.ones((problem.sampler.hilbert.n_sites,), jnp.int8)
    return model.plus_x(model.init(jax.random.PRNGKey(seed), sigma_N)["params"])


def _probes(hilbert, seed: int):
    """N_PROBES uniformly random configurations of the space (in its Sz sector, if any) [K, N]."""
    keys = jax.random.split(jax.random.PRNGKey(seed), N_PROBES)
    return jax.vmap(functools.partial(random_state, hilbert))(keys)


def check(experiment):
    """Refuses, before anything compiles, `initial_state: plus_x` for a model without `plus_x` or
    whose `plus_x` parameters do not give a uniform psi (log psi checked on a handful of
    configurations: a sector can project the uniform state away), and
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
        raise ConfigError("task.initial_state", f"is plus_x, which the model {name} cannot represent: at its "
                                                "plus_x parameters psi vanishes (log psi not finite); use "
                                                "initial_state=init_from")
    spread = float(np.max(np.abs(logpsi_K - logpsi_K[0])))
    if spread > UNIFORM_TOLERANCE * max(1.0, float(np.abs(logpsi_K[0]))):
        raise ConfigError("task.initial_state", f"is plus_x, which the model {name} cannot represent: at its "
                                                f"plus_x parameters log psi varies by {spread:.3g} over "
                                                "configurations; use initial_state=init_from")


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
    seconds: float  # compiling them took


def _begin_fn(experiment, f):
    """(params, chains) -> the DynamicsState at t = 0 (the integrator's start, f its time derivative)."""
    return lambda params, chains: start(experiment.settings.task.integrator, f, params, chains)


def _advance_fn(experiment, f):
    """(params, IntegratorState, t_end, max_steps=) -> both after steps towards t_end: the integrator's
    steps of f, or projected tVMC's (`runner.core.ptvmc`, which f does not enter)."""
    task = experiment.settings.task
    if isinstance(task.integrator, ptvmc.PTVMC):
        return functools.partial(ptvmc.advance, experiment.problem, task.integrator, task.real_time)
    return functools.partial(integrators.advance, task.integrator, f)


def compile_run(experiment, layout, initial: Initial, initial_shardings, f=None, begin=None) -> Compiled:
    """Compiles the start, the advance to a (traced) end time and the measurement for `layout`; `f`
    and `begin`: the time derivative and the start already traced for the state's shape (None: new)."""
    problem, task = experiment.problem, experiment.settings.task
    f = time_derivative(problem, task.equation) if f is None else f
    steps = _advance_fn(experiment, f)
    begin = _begin_fn(experiment, f) if begin is None else begin

    def advance(state, t_end):
        return DynamicsState(*steps(state.params, state.integrator, t_end, max_steps=STEPS_PER_CALL))

    def measured(state):
        chains, metrics = measure(problem, task.equation, experiment.observables, state.params, state.integrator.carry,
                                  task.measure_rounds)
        return state._replace(integrator=state.integrator._replace(carry=chains)), metrics

    t = time.perf_counter()
    with mesh.activate(layout):
        shape = jax.eval_shape(begin, *initial)
        shardings = mesh.shard_state(shape, layout, chain_paths=("carry",))
        begin_c = jax.jit(begin, in_shardings=tuple(initial_shardings), out_shardings=shardings).lower(*initial)
        t_end = jax.ShapeDtypeStruct((), shape.integrator.t.dtype)
        advance_c = jax.jit(advance, in_shardings=(shardings, layout.replicated), out_shardings=shardings) \
            .lower(shape, t_end)
        measure_c = jax.jit(measured, in_shardings=(shardings,), out_shardings=(shardings, layout.replicated)) \
            .lower(shape)
        begin_c, advance_c, measure_c = (programs.compiled(p, layout) for p in (begin_c, advance_c, measure_c))
    return Compiled(begin_c, advance_c, measure_c, shardings, time.perf_counter() - t)


def _initial(experiment, layout) -> tuple[Initial, Initial]:
    """(the initial parameters and chains, their shardings): plus_x (`_plus_x_params`) or the
    init_from run's parameters (and chains with init_chains)."""
    problem, seed = experiment.problem, experiment.settings.seed

    def fresh():
        return Initial(_plus_x_params(problem, seed), init_chains(problem.sampler, seed))

    shardings = mesh.shard_state(jax.eval_shape(fresh), layout)
    with mesh.activate(layout):
        initial = jax.jit(fresh, out_shardings=shardings)()
    return warm_start.warm_start(experiment, initial, shardings), shardings


class Context(NamedTuple):
    """What a time evolution keeps from its init for its compile and finish."""

    initial: Initial  # the initial parameters and chains (at t = 0)
    initial_shardings: Initial
    times: list  # the saved times
    exact: dict | None  # `exact_trajectory`'s result
    f: Any  # the time derivative (`runner.core.tdvp.time_derivative`), traced once for the run
    begin: Any  # (params, chains) -> the state at t = 0


def save(run_dir: Path, state, settings, done: int) -> int:
    """`loop.Begun.save`: the checkpoint of the state after `done` saved times (its meta's step is the
    index of the last, `done - 1`; t in its meta), labelled by that index."""
    loop.save_checkpoint(run_dir, state, settings, done - 1, t=float(mesh.to_host(state.integrator.t)))
    return done - 1


def init(experiment, layout, run_dir: Path, resuming: bool, sweep_dir=None) -> loop.Begun:
    """The initial state (plus_x or init_from's), the checkpoint's when resuming (`loop.restore`:
    ConfigError when it does not fit), and the exact dynamics where the space allows."""
    task = experiment.settings.task
    times = task.save_times()
    initial, initial_shardings = _initial(experiment, layout)
    f = time_derivative(experiment.problem, task.equation)
    begin = _begin_fn(experiment, f)
    with mesh.activate(layout):
        shape = jax.eval_shape(begin, *initial)
    shardings = mesh.shard_state(shape, layout, chain_paths=("carry",))
    state, done = None, 0  # fresh: the compiled start makes the state at t = 0
    if resuming:
        like = jax.tree_util.tree_map(lambda x: np.zeros(x.shape, x.dtype), shape)
        state, meta = loop.restore(run_dir, like, shardings)
        done = int(meta["step"]) + 1
        log.info("resumed from the checkpoint at t = %.6g", float(state.integrator.t))
    exact = exact_trajectory(experiment, mesh.to_host(initial.params), times)
    return loop.Begun(state, shardings, done, len(times), rundir.TRAJECTORY, 1, "saved time", save,
                      Context(initial, initial_shardings, times, exact, f, begin))


def compile(experiment, layout, begun: loop.Begun) -> loop.Program:  # noqa: A001 (the task's shape)
    """The compiled start, advance and measurement; the units are the saved times, each advanced to
    (`advance_to`, looking for a stop signal between calls) and measured."""
    context = begun.context
    compiled = compile_run(experiment, layout, context.initial, context.initial_shardings, context.f, context.begin)
    times = context.times

    def units(state, first, stop):
        for index in range(first, len(times)):
            if index > 0:
                state, stopped = advance_to(compiled, state, times[index], stop)
                if stopped:  # between saved times: the checkpoint of `index - 1` then holds this state
                    yield loop.Unit(index, state, stopped=True)
                    return
            if float(state.integrator.t) < times[index]:
                yield loop.Unit(index, state, failure=f"the integrator stopped at t = {float(state.integrator.t):.6g} "
                                                      f"before {times[index]}")
                return
            state, metrics = compiled.measure(state)
            yield loop.Unit(index, state, _host_metrics(state, metrics))

    def show(unit, record):
        log.info("t = %.4f  E = %.8f ± %.2e  residual %.2e  dt %.3g", record["t"], record["energy"],
                 record["energy_error"], record["residual"], record["dt"])

    state = compiled.begin(*context.initial) if begun.state is None else None
    return loop.Program(units, compiled.seconds, where=lambda state, done: f"t = {float(state.integrator.t):.6g}",
                        show=show, state=state)


def _host_metrics(state, metrics: dict) -> dict:
    """A measurement's metrics with the integrator's time, step and counts, on the host (and projected
    tVMC's last infidelity and its updates so far)."""
    if isinstance(state.integrator.k0, ptvmc.Memory):
        metrics = {**metrics, "infidelity": state.integrator.k0.infidelity,
                   "n_iterations": state.integrator.k0.iterations}
    t, dt, accepted, rejected, metrics = mesh.to_host((state.integrator.t, state.integrator.dt,
                                                       state.integrator.n_accepted, state.integrator.n_rejected,
                                                       metrics))
    return {"t": t, **metrics, "dt": dt, "n_steps": accepted, "n_rejected": rejected}


def record(experiment, unit: loop.Unit, records: list) -> tuple[dict, str | None]:
    """A saved time's trajectory.jsonl record (non-finite values None) and why the run stops there:
    an energy or error bar that is not finite."""
    m, counts = unit.metrics, ("n_steps", "n_rejected", "n_iterations")
    out = {"t": float(m["t"]), **{k: finite(v) for k, v in m.items() if k not in ("t", "dt", *counts)},
           "dt": float(m["dt"]), **{k: int(m[k]) for k in counts if k in m}}
    if out["energy"] is None or out["energy_error"] is None:
        return out, f"energy is not finite at t = {out['t']:.6g}"
    return out, None


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


def _summary(experiment, status, reason, state, records, *, errors, seconds: dict, layout) -> dict:
    task = experiment.settings.task
    summary = {"task": "dynamics", "status": status, "reason": reason,
               "t_reached": records[-1]["t"] if records else None, "t_end": task.t_end,
               "n_saved": len(records), "n_steps": int(state.integrator.n_accepted) if state is not None else 0,
               "n_rejected": int(state.integrator.n_rejected) if state is not None else 0, "seed": experiment.settings.seed,
               "n_sites": experiment.hilbert.n_sites, **layout_fields(experiment, layout), **seconds}
    if records:
        kept = ("energy", "obs/", "residual", "infidelity")
        summary.update({k: v for k, v in records[-1].items() if k.startswith(kept)})
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


def finish(experiment, layout, run_dir: Path, ended: loop.Ended) -> loop.Finished:
    """The summary (against the exact dynamics where it was computed), exact_trajectory.json and
    dynamics.png."""
    exact, records, state = ended.begun.context.exact, ended.records, ended.state
    compile_seconds = ended.program.compile_seconds if ended.program is not None else None
    result = _summary(experiment, ended.status, ended.reason, state, records, errors=max_abs_errors(records, exact),
                      layout=layout, seconds={"compile_seconds": compile_seconds,
                                              "wall_seconds": time.perf_counter() - ended.started})
    log_warnings(result)

    def write(run_dir):
        if exact is not None:
            checkpoint.write_atomic(run_dir / rundir.EXACT_TRAJECTORY, lambda f: f.write(json.dumps(exact).encode()))
        trajectory_plot.plot_trajectory(records, exact, run_dir / rundir.DYNAMICS_PLOT, unit=result["energy_unit"])

    return loop.Finished(result, write, (final_line(result),))


TASK = loop.Task("dynamics", init, compile, record, finish)
