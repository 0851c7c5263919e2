"""The ground state (task=ground_state) as a `runner.lifecycle.loop.Task`: n_iter compiled VMC steps from a
fresh or resumed state, every step's metrics in metrics.jsonl, then the final estimate, the peak check and
the comparison with the exact ground state. task=excited trains by the same steps (`compile`, `record`)."""

import functools
import logging
import sys
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from tqdm import tqdm

from runner.core import observe
from runner.core.estimate import draws_estimate_samples
from runner.core.full_sum import FullSumSampler
from runner.core.problem import draw
from runner.core.vmc import full_sum_invariance_error, init_state, update_step, vmc_step
from runner.diagnostics import collapse, health
from runner.errors import ConfigError
from runner.lifecycle import loop, programs, rundir, sector_check, warm_start
from runner.lifecycle.finish import Exact, conclude, exact_ground, write_files
from runner.outputs.summary import Outcome, Timings, finite, report, summarise
from runner.parallel import mesh
from runner.physics import observables

log = logging.getLogger(__name__)

# a step whose energy, or its variance or error bar, is not finite (None in its record) stops the run:
# a finite mean of local energies whose variance overflowed is no energy either
GUARDED = ("energy", "variance", "energy_error")


class CompiledStep(NamedTuple):
    """The VMC step (`runner.core.vmc.vmc_step`), compiled; called with a state, one step. Where the
    final estimate can draw its rounds with the step's sampling (`draws_estimate_samples`) it is two
    programs: `draw`, (params, chains) -> the step's samples (`runner.core.problem.draw`), which the
    final estimate runs again (`runner.lifecycle.finish.final_estimate`), and `update`, (state,
    samples) -> (state, metrics) (`runner.core.vmc.update_step`). Otherwise `draw` is None and
    `update` is the whole step, state -> (state, metrics): one program keeps a full sum's
    reductions together, bit for bit on every layout (docs/notes/finishing.md)."""

    draw: Callable | None
    update: Callable

    def __call__(self, state):
        if self.draw is None:
            return self.update(state)
        return self.update(state, self.draw(state.params, state.chains))


class Context(NamedTuple):
    """What a ground-state run keeps from its init for its finish."""

    exact: Exact  # the exact ground state's numbers (None fields where not computed)
    spectrum: Any  # `sector_check.exact_spectrum`'s result, or None
    n_params: int


def compile_step(experiment, state, shardings, layout) -> CompiledStep:
    """The VMC step (and the observables it measures), compiled for `state` laid out by `shardings`."""
    problem = experiment.problem
    observer = observe.step_observer(experiment.observables, problem)
    # Under the mesh, dense SR gathers Obar onto every device and forms the Gram matrix in one
    # product (runner/core/precond.py): bitwise equal on every layout, and as fast as the
    # layout-dependent product.
    with mesh.activate(layout):
        if not draws_estimate_samples(problem):
            step = functools.partial(vmc_step, problem, observe=observer)
            lowered = jax.jit(step, in_shardings=(shardings,),
                              out_shardings=(shardings, layout.replicated)).lower(state)
            return CompiledStep(None, programs.compiled(lowered, layout))
        drawn = jax.eval_shape(functools.partial(draw, problem), state.params, state.chains)
        drawn_shardings = mesh.shard_by_rank(drawn, layout)
        draw_fn = jax.jit(functools.partial(draw, problem), in_shardings=(shardings.params, shardings.chains),
                          out_shardings=drawn_shardings).lower(state.params, state.chains)
        update = functools.partial(update_step, problem, observe=observer)
        update_fn = jax.jit(update, in_shardings=(shardings, drawn_shardings),
                            out_shardings=(shardings, layout.replicated)).lower(state, drawn)
        draw_fn, update_fn = programs.compiled(draw_fn, layout), programs.compiled(update_fn, layout)
    return CompiledStep(draw_fn, update_fn)


def place_state(problem, settings, layout):
    """Initial state, created directly with its shardings (chains split, rest replicated)."""
    sigma_N = jnp.ones((problem.sampler.hilbert.n_sites,), jnp.int8)
    init = functools.partial(init_state, problem, settings.seed, sigma_N)
    shardings = mesh.shard_state(jax.eval_shape(init), layout)
    return jax.jit(init, out_shardings=shardings)(), shardings


def start(experiment, layout, run_dir, resuming: bool):
    """(state, shardings, n_params, steps done): a fresh state (warm-started with `init_from`), or the
    checkpoint's when resuming (`loop.restore` refuses one that does not fit this config)."""
    state, shardings = place_state(experiment.problem, experiment.settings, layout)
    if not resuming:  # a warm start (init_from) replaces the initial parameters (and chains)
        state = warm_start.warm_start(experiment, state, shardings)
    n_params = sum(x.size for x in jax.tree_util.tree_leaves(state.params))
    if not resuming:
        return state, shardings, n_params, 0
    state, meta = loop.restore(run_dir, state, shardings)
    log.info("resumed from checkpoint at step %d", int(meta["step"]))
    return state, shardings, n_params, int(meta["step"])


def check_full_sum(problem, seed):
    """Refuses (ConfigError) a full sum over orbits that does not fit the model (checked on the
    seed's initial parameters and another draw, on this process's default device)."""
    if not isinstance(problem.sampler, FullSumSampler) or problem.sampler.symmetry == "none":
        return
    sigma_N = jnp.ones((problem.sampler.hilbert.n_sites,), jnp.int8)
    draws = [problem.model.init(jax.random.PRNGKey(k), sigma_N)["params"] for k in (seed, seed + 1)]
    error = full_sum_invariance_error(problem, draws)
    if error is not None:
        raise ConfigError("sampler.symmetry", error)


def begun(experiment, state, shardings, done: int, context) -> loop.Begun:
    """The `loop.Begun` of a run whose units are the VMC steps (this task's and task=excited's)."""
    settings = experiment.settings
    return loop.Begun(state, shardings, done, settings.n_iter, rundir.METRICS, settings.checkpoint_every, "step",
                      loop.save_steps, context)


def init(experiment, layout, run_dir, resuming: bool, sweep_dir=None) -> loop.Begun:
    """The exact ground state (where `exact` asks; shared through the cache of the sweep in
    `sweep_dir`; beyond its reach, the ground energy of the spectrum by sector where that runs), the
    start's checks, and the fresh or resumed state."""
    exact = exact_ground(experiment, sweep_dir)
    check_full_sum(experiment.problem, experiment.settings.seed)
    state, shardings, n_params, done = start(experiment, layout, run_dir, resuming)
    found = sector_check.exact_spectrum(experiment)  # before the first step; every process alike
    if exact.energy is None and found is not None:
        exact = exact._replace(energy=found[1][1])
    sector_check.check_start(experiment, state, found, exact.energy)
    return begun(experiment, state, shardings, done, Context(exact, found, n_params))


def compile(experiment, layout, begun: loop.Begun) -> loop.Program:  # noqa: A001 (the task's shape)
    """The compiled VMC step, its steps dispatched one ahead of their metrics' fetch, and a progress
    bar with a log line every tenth of the run."""
    t = time.perf_counter()
    step_fn = compile_step(experiment, begun.state, begun.shardings, layout)
    compile_seconds = time.perf_counter() - t
    bar = _progress(begun.n_units, begun.done)
    log_every = max(1, begun.n_units // 10)

    def units(state, first, stop):
        # Metrics are read one step late: step k+1 is dispatched before step k's metrics are
        # fetched, so the device never waits for logging. (No buffer donation: the state of
        # step k stays valid for a checkpoint while step k+1 runs.)
        pending = step_fn(state) if first < begun.n_units else None
        for step in range(first, begun.n_units):
            new_state, metrics = pending
            if step + 1 < begun.n_units:
                pending = step_fn(new_state)
            yield loop.Unit(step, new_state, mesh.to_host(metrics))

    return loop.Program(units, compile_seconds, where=lambda state, done: f"step {done}", show=shows(bar, log_every),
                        close=bar.close, extra=step_fn.draw)


def shows(bar, log_every: int):
    """`loop.Program.show` of VMC steps: each kept step on the progress bar `bar` and, every `log_every`
    steps, in the log; a step reject_jump rejected for its unusable estimate as a warning."""

    def show(unit, record):
        unusable = _unusable(record)
        reason = _non_finite_reason(unit.metrics, unusable, unit.index) if unusable else None
        _show(bar, record, reason, unit.index, log_every)

    return show


def record(experiment, unit: loop.Unit, records: list) -> tuple[dict, str | None]:
    """A step's metrics.jsonl record (non-finite values None, obs/ fields only at the steps that
    measured) and why the run stops there: a non-finite estimate (`GUARDED`; not on a step
    reject_jump rejected, whose parameters are dropped anyway: the next step measures the kept
    state), or a collapse of the chains (`runner.diagnostics.collapse.check_collapse`)."""
    out = observables.keep_measured({"step": unit.index, **{k: finite(v) for k, v in unit.metrics.items()}})
    unusable = _unusable(out)
    if unusable and not out.get("rejected"):
        return out, _non_finite_reason(unit.metrics, unusable, unit.index)
    return out, collapse.check_collapse([*records, out], n_sites=experiment.hilbert.n_sites,
                                      metropolis=health.metropolis(experiment.problem.sampler))


def finish(experiment, layout, run_dir, ended: loop.Ended) -> loop.Finished:
    """After a completed training the final estimate, the peak check and the sector fields; the
    summary, energy.png, correlations.json and spectrum.json."""
    context, settings = ended.begun.context, experiment.settings
    exact = context.exact
    final, observed, peak_check = {}, None, None
    if ended.status == "completed":
        final, observed, peak_check = conclude(experiment, layout, ended.state, ended.begun.shardings,
                                                      ended.program.extra, exact)
    found = context.spectrum if ended.status == "completed" else None
    sector = sector_check.relative_error(sector_check.fields(experiment, ended.state, found, exact.energy),
                                         final.get("energy"))
    compile_seconds = ended.program.compile_seconds if ended.program is not None else None
    timings = Timings.of(ended.step_times, compile_seconds, time.perf_counter() - ended.started)
    outcome = Outcome(status=ended.status, reason=ended.reason, final=final, exact_energy=exact.energy,
                      n_params=context.n_params, timings=timings, peak_check=peak_check,
                      observed=observed[0] if observed else None, sector=sector)
    result = summarise(experiment, layout, outcome, ended.records)
    report(result)

    def write(run_dir):
        write_files(run_dir, result, ended.records, exact.energy, observed[1] if observed else None)
        sector_check.write(run_dir, found)

    return loop.Finished(result, write)


def holds(experiment, records: list) -> bool:
    """A checkpoint due now waits while the newest step shows the start of a collapse
    (`runner.diagnostics.collapse.collapsing`)."""
    return collapse.collapsing(records, n_sites=experiment.hilbert.n_sites,
                             metropolis=health.metropolis(experiment.problem.sampler))


def recover(experiment, begun: loop.Begun, kept, failing):
    """`loop.Task.recover` (`Problem.recover`, with reject_jump): the last good checkpoint's state `kept`
    with the guard's ceiling on the step scale half that of the `failing` state (so each recovery halves
    every later step again), or None once the ceiling would fall below 2^-recover. The guard's
    scalars are read and placed on the host: the same numbers on every layout."""
    if not experiment.problem.recover:
        return None
    failing_ceiling, scale, kept_ceiling = mesh.to_host((failing.guard.ceiling, kept.guard.scale, kept.guard.ceiling))
    ceiling = failing_ceiling / 2  # NumPy scalars of the guard's dtype
    if ceiling < 2.0 ** -experiment.problem.recover:
        return None
    placed = begun.shardings.guard
    scale, ceiling = mesh.from_host((scale * (ceiling / kept_ceiling), ceiling), (placed.scale, placed.ceiling))
    return kept._replace(guard=kept.guard._replace(scale=scale, ceiling=ceiling))


TASK = loop.Task("ground_state", init, compile, record, finish, holds, recover)


def _unusable(record) -> list:
    """The `GUARDED` keys of a metrics record that `finite` made None."""
    return [k for k in GUARDED if k in record and record[k] is None]


def _non_finite_reason(metrics, unusable, step) -> str:
    """Why a step's estimate is unusable, from its raw `metrics` and `_unusable` keys."""
    if "energy" in unusable:
        return f"energy is {float(metrics['energy'])} at step {step}"
    spread = ", ".join(f"{k} {float(metrics[k])}" for k in unusable)
    return f"energy is {float(metrics['energy']):.6g} with {spread} at step {step}"


def _progress(n_iter: int, start: int):
    """A progress bar where the log is printed: on a terminal (tqdm disables itself otherwise) and
    only while a root handler prints the log there (Hydra's console handler in the CLI; none under
    `runner.run(quiet=True)`, which then shows no bar either)."""
    shown = any(prints_to_terminal(h) for h in logging.getLogger().handlers)
    return tqdm(total=n_iter, initial=start, disable=None if shown else True, file=sys.stderr, dynamic_ncols=True)


def prints_to_terminal(handler) -> bool:
    """Whether a log handler prints to the terminal (a plain StreamHandler on stderr or stdout)."""
    return type(handler) is logging.StreamHandler and getattr(handler, "stream", None) in (sys.stderr, sys.stdout)


def _show(bar, record: dict, reason: str | None, step: int, log_every: int):
    """A kept step on the progress bar and, every `log_every` steps, in the log; `reason`: why its
    estimate is unusable (reject_jump rejected it)."""
    bar.update(1)
    if reason is not None:
        log.warning("%s; rejected (reject_jump): the next step measures the kept parameters again", reason)
        return
    bar.set_postfix_str(f"E={record['energy']:.6f}±{record['energy_error']:.1e} acc={record['acceptance']:.2f}")
    if (step + 1) % log_every == 0:
        log.info("step %d  E = %.8f ± %.2e  var %.3e  acc %.2f", step + 1, record["energy"],
                 record["energy_error"], record["variance"], record["acceptance"])
