"""The one loop every task runs in: a task's `init`, `compile`, `record` for each unit (a training
step, a saved time) and `finish`, with the stop signals, the checkpoint cadence, the task's JSONL log,
summary.json (`rundir.write_summary`) and the trackers."""

import json
import logging
import time
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

from runner.config import fingerprint
from runner.errors import ConfigError
from runner.lifecycle import checkpoint, rundir
from runner.lifecycle.preemption import StopRequest
from runner.parallel import distributed, mesh

log = logging.getLogger(__name__)


class Task(NamedTuple):
    """What a run does, in the optax shape: pure-ish functions the loop (`run`) calls in order.

    init: (experiment, layout, run_dir, resuming, sweep_dir) -> `Begun`: the state to start from (fresh, or the
        checkpoint's), the units done, the exact numbers the run compares with.
    compile: (experiment, layout, begun) -> `Program`: the compiled programs, stepping through units.
    record: (experiment, unit, records) -> (the unit's log record, why the run fails at it or None),
        `records` the records before it (the loop adds the record's `wall_time`).
    finish: (experiment, layout, run_dir, ended) -> `Finished`: the summary and the task's files.
    holds: (experiment, records) -> whether a checkpoint due after the newest record waits for a
        later unit (the record shows the start of what `record` fails a run on after some units).
    recover: (experiment, begun, kept, failing) -> the state to go on from instead of failing: `kept`,
        the state of the last good checkpoint, changed so the run does not fail the same way again
        (`failing`: the state of the last unit before the failure), or None (the run fails).
    """

    name: str
    init: Callable
    compile: Callable
    record: Callable
    finish: Callable
    holds: Callable = lambda experiment, records: False
    recover: Callable = lambda experiment, begun, kept, failing: None


class Begun(NamedTuple):
    """Where a run starts: `state` (placed by `shardings`), `done` of `n_units` units already done (a
    resumed run's), the log file, the checkpoint cadence in units, the unit's name in sentences,
    the `save` of a checkpoint ((run_dir, state, settings, done) -> the checkpoint's label), and
    what the task keeps for its finish (`context`)."""

    state: Any
    shardings: Any
    done: int
    n_units: int
    log_name: str
    checkpoint_every: int
    unit: str  # "step", "saved time"
    save: Callable
    context: Any = None


class Unit(NamedTuple):
    """One unit a program ran: its index, the state after it and its metrics (on the host). `stopped`:
    a stop signal came within the unit (the state is where it got to; nothing is recorded);
    `failure`: why the program could not finish the unit."""

    index: int
    state: Any
    metrics: dict | None = None
    stopped: bool = False
    failure: str | None = None


class Program(NamedTuple):
    """A task's compiled programs: `units`, (state, first, stop) -> the units from `first` on, lazily;
    `state`: the state they start from (None: the begun one); `where`: (state, units done) -> where it stands, in
    a stop's reason ("step 12", "t = 0.3"); `show`: (unit, record) -> None, the log line or progress
    bar of a kept unit; `close` ends the display; what the finish uses (`extra`)."""

    units: Callable[..., Iterator[Unit]]
    compile_seconds: float
    where: Callable
    show: Callable
    close: Callable = lambda: None
    state: Any = None
    extra: Any = None


class Ended(NamedTuple):
    """How the units ended, for the task's finish."""

    begun: Begun
    program: Program | None  # None: stopped before compiling
    state: Any  # of the last good unit
    status: str  # completed, failed, preempted or interrupted
    reason: str | None  # why it did not complete
    records: list  # every unit's record, a resumed run's earlier ones first
    step_times: list  # seconds of each unit taken
    started: float  # perf_counter at the command's start


class Finished(NamedTuple):
    """A task's finish: the summary, what process 0 writes before it (plots, tables: `write`,
    (run_dir) -> None), and the final log lines."""

    summary: dict
    write: Callable = lambda run_dir: None
    lines: tuple = ()


class RecordLog:
    """A task's JSONL log (metrics.jsonl, trajectory.jsonl), one record per unit; cut back to the
    units a checkpoint holds on resume. Every record also goes to the trackers."""

    def __init__(self, path: Path, kept: int, tracking=None):
        self.path, self.tracking = path, tracking
        lines = path.read_text().splitlines() if kept and path.exists() else []
        self.records = [json.loads(line) for line in lines if line.strip()]
        self.cut(kept)

    def cut(self, kept: int):
        """Drops the records after the first `kept` (a resumed run, or one that goes back to a
        checkpoint) and rewrites the log; the trackers keep what they were sent."""
        self.records = self.records[:kept]
        if distributed.is_main():
            self.path.write_text("".join(json.dumps(r) + "\n" for r in self.records))

    def append(self, record: dict, index: int):
        self.records.append(record)
        if distributed.is_main():
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")
            if self.tracking is not None:
                self.tracking.log_metrics(record if "step" in record else {"step": index, **record})


def save_checkpoint(run_dir: Path, state, settings, step: int, **extra):
    """Checkpoints `state` after `step` steps, `extra` added to its meta (a collective: every
    process takes part; process 0 writes)."""
    host_state = mesh.to_host(state)
    if distributed.is_main():
        meta = {"step": step, **extra, "seed": settings.seed,
                "config_fingerprint": fingerprint.record(settings.fingerprint)}
        checkpoint.save(run_dir / rundir.CHECKPOINT, host_state, meta)


def save_steps(run_dir: Path, state, settings, done: int) -> int:
    """`Begun.save` of a task whose units are steps: the checkpoint of `done` steps, labelled `done`."""
    save_checkpoint(run_dir, state, settings, done)
    return done


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


def run(task: Task, experiment, layout, run_dir: Path, resuming: bool, *, stop: StopRequest, tracking=None,
        started: float, sweep_dir: Path | None = None) -> dict:
    """The run of `task` in `run_dir` (fresh, or resumed from its checkpoint): the units, the task's
    files, summary.json and the trackers' close. Returns the summary whatever its status
    (`runner.app.ended` raises for a failed or stopped run); a stopped run under submitit is
    requeued (`StopRequest.hand_over`). `sweep_dir`: the directory of the sweep the run is a point of,
    whose caches it shares (None: a single run)."""
    begun = task.init(experiment, layout, run_dir, resuming, sweep_dir)
    records = RecordLog(run_dir / begun.log_name, begun.done,
                        tracking.open(begun.done) if tracking is not None else None)
    ended = _units(task, experiment, layout, begun, run_dir=run_dir, records=records, stop=stop, started=started)
    finished = task.finish(experiment, layout, run_dir, ended)
    if distributed.is_main():
        finished.write(run_dir)
        rundir.write_summary(run_dir, finished.summary)
        if tracking is not None:
            tracking.close(finished.summary)
    for line in finished.lines:
        log.info(line)
    if ended.status in ("preempted", "interrupted"):
        stop.hand_over()  # under submitit: requeues the job (and exits)
    return finished.summary


def _units(task: Task, experiment, layout, begun: Begun, *, run_dir: Path, records: RecordLog, stop: StopRequest,
           started: float) -> Ended:
    """Compiles the task's programs and runs its units from `begun.done` to `begun.n_units`
    (`_through`); a stop signal before or during compilation ends the run before its first unit."""

    def ending(state, status, reason, program=None, times=()):
        return Ended(begun, program, state, status, reason, records.records, list(times), started)

    pending = begun.done < begun.n_units
    if pending and stop.requested():  # during the set-up: nothing to compile
        return ending(begun.state, *_stopped_before_first(stop, begun.unit))
    program = task.compile(experiment, layout, begun)
    state = begun.state if program.state is None else program.state
    if pending and stop.requested():  # during compilation
        program.close()
        return ending(state, *_stopped_before_first(stop, begun.unit), program)
    times = []
    state, status, reason = _through(task, experiment, begun, program, state, times, run_dir=run_dir,
                                     records=records, stop=stop, started=started)
    program.close()
    return ending(state, status, reason, program, times)


def _through(task, experiment, begun: Begun, program: Program, state, times: list, *, run_dir, records, stop,
             started) -> tuple:
    """(state, status, reason) after the units from `begun.done` on, each unit's seconds appended to
    `times`. Where a unit fails, the task's `recover` may give a state to go on from, at the last good
    checkpoint (its records after that cut back); else the run stops ("failed": the state of that unit is
    dropped; the task's `record` judges). A stop signal ends it too ("preempted", or "interrupted" for
    Ctrl-C, after saving a checkpoint where the run got to: between units, or within one). A checkpoint
    is saved every `begun.checkpoint_every` units (one due while `task.holds` waits for the first unit
    after that does not hold) and after the last."""
    # the newest checkpoint this run can fall back on (unit 0: none, the start) and its state
    kept = {"unit": begun.done, "state": state}
    first = begun.done
    while True:
        state, status, reason = _pass(task, experiment, begun, program, state, first, times=times, kept=kept,
                                      run_dir=run_dir, records=records, stop=stop, started=started)
        if status != "failed":
            return state, status, reason
        back = task.recover(experiment, begun, kept["state"], state)
        if back is None:
            where = (f"the last good checkpoint is {begun.unit} {kept['unit']}" if kept["unit"] > 0
                     else "no checkpoint was written (the run starts over when run again)")
            log.error("%s; stopping, %s", reason, where)
            return state, "failed", reason
        first = kept["unit"]
        where = "where the last good checkpoint is" if first > 0 else "the start (no checkpoint was written)"
        log.warning("%s; going back to %s %d, %s (recover)", reason, begun.unit, first, where)
        records.cut(first)
        state = kept["state"] = back


def _pass(task, experiment, begun: Begun, program: Program, state, first: int, *, times: list, kept: dict, run_dir,
          records, stop, started) -> tuple:
    """`_through`'s units from `first` on, until the last, a failure or a stop: (the state of the last
    good unit, status, reason); status "failed" leaves the recovery to `_through`. Each checkpoint saved
    between units goes into `kept` (its unit count and state)."""
    settings, t = experiment.settings, time.perf_counter()
    due = False  # a checkpoint came due and waits while `task.holds`
    for unit in program.units(state, first, stop):
        times.append(time.perf_counter() - t)
        t = time.perf_counter()
        if unit.stopped:  # within the unit: its checkpoint holds where it got to
            stop.checkpoint_saved(begun.save(run_dir, unit.state, settings, unit.index))
            return unit.state, stop.status, (f"{stop.describe()} received; stopped at "
                                             f"{program.where(unit.state, unit.index)} between {begun.unit}s after "
                                             "saving a checkpoint")
        failure = unit.failure
        if failure is None:
            record, failure = task.record(experiment, unit, records.records)
            record["wall_time"] = time.perf_counter() - started
            records.append(record, unit.index)
        if failure is not None:
            return state, "failed", failure
        state, done = unit.state, unit.index + 1
        program.show(unit, record)
        due = due or done % begun.checkpoint_every == 0
        saved = done == begun.n_units or (due and not task.holds(experiment, records.records))
        label = begun.save(run_dir, state, settings, done) if saved else None
        if saved:
            kept.update(unit=done, state=state)
        due = due and not saved
        if done == begun.n_units:
            break
        if stop.requested():
            log.warning("%s received: saving a checkpoint at %s", stop.describe(), program.where(state, done))
            stop.checkpoint_saved(label if saved else begun.save(run_dir, state, settings, done))
            # only now may a second Ctrl-C's sentence and the summary say so
            return state, stop.status, (f"{stop.describe()} received; stopped at {program.where(state, done)} after "
                                        "saving a checkpoint")
    return state, "completed", None


def _stopped_before_first(stop: StopRequest, unit: str) -> tuple[str, str]:
    """Status and reason of a run stopped before its first unit: no new checkpoint (the one that
    exists, if any, is still this run's latest state)."""
    reason = f"{stop.describe()} received before the first {unit}"
    log.warning("%s; stopping", reason)
    return stop.status, reason
