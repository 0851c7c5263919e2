"""The training loop: the compiled step from a start to n_iter, every step's metrics in
metrics.jsonl, checkpoints on the way, and what stops it early."""

import functools
import json
import logging
import sys
import time
from pathlib import Path
from typing import Callable, NamedTuple

import jax
from tqdm import tqdm

from runner.config import fingerprint
from runner.core import observe
from runner.core.estimate import draws_estimate_samples
from runner.core.problem import draw
from runner.core.vmc import update_step, vmc_step
from runner.diagnostics import health
from runner.errors import ConfigError
from runner.lifecycle import checkpoint, rundir
from runner.lifecycle.preemption import StopRequest
from runner.outputs.summary import finite
from runner.parallel import distributed, mesh
from runner.physics import observables

log = logging.getLogger(__name__)

# a step whose energy, or its variance or error bar, is not finite (None in its record) stops the run:
# a finite mean of local energies whose variance overflowed is no energy either
GUARDED = ("energy", "variance", "energy_error")


class MetricsLog:
    """metrics.jsonl, one JSON object per step; truncated to a checkpoint on resume."""

    def __init__(self, path: Path, resume_step: int, started: float):
        self.path = path
        self.started = started
        kept = []
        if resume_step and path.exists() and distributed.is_main():
            for line in path.read_text().splitlines():
                if line.strip() and json.loads(line)["step"] < resume_step:
                    kept.append(line)
        if distributed.is_main():
            path.write_text("".join(line + "\n" for line in kept))
        self.records = [json.loads(line) for line in kept]
        self.tracking = None  # loggers.Tracking: every record also goes to the chosen trackers

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def append(self, record: dict):
        self.records.append(record)
        if distributed.is_main():
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")
            if self.tracking is not None:
                self.tracking.log_metrics(record)


class Training(NamedTuple):
    """How training ended: the state of its last good step and why it stopped."""

    state: object
    status: str  # completed, failed, preempted or interrupted
    reason: str | None  # why it did not complete
    step_times: list  # seconds of each step taken
    compile_seconds: float | None  # None when stopped before compiling
    draw: Callable | None = None  # the step's compiled sampling (`CompiledStep.draw`); None before compiling


def save_checkpoint(run_dir: Path, state, settings, step: int, **extra):
    """Checkpoints `state` after `step` steps, `extra` added to its meta (a collective: every
    process takes part; process 0 writes)."""
    host_state = mesh.to_host(state)
    if distributed.is_main():
        meta = {"step": step, **extra, "seed": settings.seed,
                "config_fingerprint": fingerprint.record(settings.fingerprint)}
        checkpoint.save(run_dir / rundir.CHECKPOINT, host_state, meta)


def restore(run_dir: Path, state, shardings):
    """(state, meta) of run_dir's checkpoint, placed like `state`.

    Raises:
        ConfigError: the checkpoint is unreadable (`checkpoint.CorruptCheckpoint`) or does not fit
            this config (its arrays' shapes or types differ).
    """
    try:
        loaded, meta = checkpoint.load(run_dir / rundir.CHECKPOINT, state)
    except checkpoint.CorruptCheckpoint:
        raise
    except ValueError as err:
        raise ConfigError("resume", f"found a checkpoint that does not fit this config ({err}); use a new run "
                                    "directory or resume=false") from err
    return mesh.from_host(loaded, shardings), meta


def stopped_before_first_step(stop: StopRequest) -> tuple[str, str]:
    """Status and reason of a run stopped before its first step: no new checkpoint (the one
    that exists, if any, is still this run's latest state)."""
    reason = f"{stop.describe()} received before the first step"
    log.warning("%s; stopping", reason)
    return stop.status, reason


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
            return CompiledStep(None, jax.jit(step, in_shardings=(shardings,),
                                              out_shardings=(shardings, layout.replicated)).lower(state).compile())
        drawn = jax.eval_shape(functools.partial(draw, problem), state.params, state.chains)
        drawn_shardings = mesh.shard_by_rank(drawn, layout)
        draw_fn = jax.jit(functools.partial(draw, problem), in_shardings=(shardings.params, shardings.chains),
                          out_shardings=drawn_shardings).lower(state.params, state.chains).compile()
        update = functools.partial(update_step, problem, observe=observer)
        update_fn = jax.jit(update, in_shardings=(shardings, drawn_shardings),
                            out_shardings=(shardings, layout.replicated)).lower(state, drawn).compile()
    return CompiledStep(draw_fn, update_fn)


def train(experiment, layout, state, shardings, start: int, *, run_dir: Path, metrics_log: MetricsLog,
          stop: StopRequest) -> Training:
    """Compiles the step and runs `optimize` from `start` (nothing when `stop` came during the set-up)."""
    if stop.requested():  # during the set-up: nothing to compile
        return Training(state, *stopped_before_first_step(stop), [], None)
    t = time.perf_counter()
    step_fn = compile_step(experiment, state, shardings, layout)
    compile_seconds = time.perf_counter() - t
    collapsed = functools.partial(health.check_collapse, n_sites=experiment.hilbert.n_sites,
                                  metropolis=health.metropolis(experiment.problem.sampler))
    state, status, reason, step_times = optimize(step_fn, state, start, experiment.settings, run_dir,
                                                 metrics_log=metrics_log, stop=stop, collapsed=collapsed)
    return Training(state, status, reason, step_times, compile_seconds, step_fn.draw)


def _unusable(record) -> list:
    """The `GUARDED` keys of a metrics record that `finite` made None."""
    return [k for k in GUARDED if k in record and record[k] is None]


def _non_finite_reason(metrics, unusable, step) -> str:
    """Why a step's estimate is unusable, from its raw `metrics` and `_unusable` keys."""
    if "energy" in unusable:
        return f"energy is {float(metrics['energy'])} at step {step}"
    spread = ", ".join(f"{k} {float(metrics[k])}" for k in unusable)
    return f"energy is {float(metrics['energy']):.6g} with {spread} at step {step}"


def _failure(metrics, unusable, step, collapsed, records) -> str | None:
    """Why training stops at this step (its record the last of `records`): a non-finite estimate
    (`_unusable`; not on a step reject_jump rejected: the next step measures the kept state), or a
    collapse (`collapsed`); None to go on."""
    if unusable and not records[-1].get("rejected"):
        return _non_finite_reason(metrics, unusable, step)
    return collapsed(records) if collapsed is not None else None


def _record(step: int, metrics: dict, wall_time: float) -> dict:
    """A step's metrics.jsonl record: non-finite values as None, obs/ fields only at the steps that measured."""
    record = {"step": step, **{k: finite(v) for k, v in metrics.items()}}
    record["wall_time"] = wall_time
    return observables.keep_measured(record)


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


def optimize(step_fn, state, start: int, settings, run_dir: Path, *, metrics_log: MetricsLog, stop: StopRequest,
             collapsed=None):
    """Steps from `start` to `n_iter`, logging metrics and checkpointing.

    Stops early on a non-finite energy, variance or error ("failed", the state of the last step is dropped;
    not on a step that `reject_jump` rejected, whose parameters are dropped anyway), on a collapse
    (`collapsed`: records -> reason or None, `runner.diagnostics.health.check_collapse`; "failed")
    or a stop signal ("preempted", or "interrupted" for Ctrl-C, after saving a checkpoint at
    the current step).

    Returns:
        (state, status, reason, step_times); `reason` says why a run did not complete (None if it did).
    """
    status, reason, step_times = "completed", None, []
    last_good = start if start > 0 else None  # the newest checkpoint this run can fall back on
    bar = _progress(settings.n_iter, start)
    log_every = max(1, settings.n_iter // 10)
    # Metrics are read one step late: step k+1 is dispatched before step k's metrics are
    # fetched, so the device never waits for logging. (No buffer donation: the state of
    # step k stays valid for a checkpoint while step k+1 runs.)
    if start < settings.n_iter and stop.requested():  # during compilation
        bar.close()
        return (state, *stopped_before_first_step(stop), step_times)
    pending = step_fn(state) if start < settings.n_iter else None
    t = time.perf_counter()
    for step in range(start, settings.n_iter):
        new_state, metrics = pending
        if step + 1 < settings.n_iter:
            pending = step_fn(new_state)
        metrics = mesh.to_host(metrics)
        now = time.perf_counter()
        step_times.append(now - t)
        t = now
        record = _record(step, metrics, metrics_log.elapsed())
        unusable = _unusable(record)
        metrics_log.append(record)
        failure = _failure(metrics, unusable, step, collapsed, metrics_log.records)
        if failure is not None:
            status, reason = "failed", failure
            kept = (f"the last good checkpoint is step {last_good}" if last_good is not None
                    else "no checkpoint was written (the run starts over when run again)")
            log.error("%s; stopping, %s", reason, kept)
            break
        state = new_state
        _show(bar, record, _non_finite_reason(metrics, unusable, step) if unusable else None, step, log_every)
        if step + 1 == settings.n_iter:
            break
        if stop.requested():
            log.warning("%s received: saving a checkpoint at step %d", stop.describe(), step + 1)
            save_checkpoint(run_dir, state, settings, step + 1)
            stop.checkpoint_saved(step + 1)  # only now may a second Ctrl-C's sentence and the summary say so
            status = stop.status
            reason = f"{stop.describe()} received; stopped at step {step + 1} after saving a checkpoint"
            break
        if (step + 1) % settings.checkpoint_every == 0:
            save_checkpoint(run_dir, state, settings, step + 1)
            last_good = step + 1
    bar.close()
    return state, status, reason, step_times
