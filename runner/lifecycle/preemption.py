"""Stop signals: a signal only sets a flag; the run loop stops cleanly at a step boundary.

SLURM sends SIGTERM to every task on preemption or `scontrol requeue`; submitit sends SIGUSR2
to global rank 0 only, shortly before the time limit; Ctrl-C sends SIGINT. Every process must
agree to stop at the same step (they take part in the checkpoint's collectives together), so
the flag is combined over processes at each step boundary. A second Ctrl-C aborts at once.
"""

import os
import signal
import sys

import numpy as np

from runner.parallel import distributed

SIGNALS = (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)
EXIT_PREEMPTED = 3  # exit status of a run stopped by SIGTERM/SIGUSR2 after saving its checkpoint
SECOND_INTERRUPT = "Interrupted again: stopped at once, without a checkpoint of the current step."
# ... or, once the first Ctrl-C's checkpoint is written (`StopRequest.checkpoint_saved`):
SECOND_INTERRUPT_SAVED = "Interrupted again: stopped at once, after saving the checkpoint of step {step}."
EXIT_INTERRUPTED = 130  # Ctrl-C, after saving its checkpoint: the shell's 128 + SIGINT


def status_of(signum: int | None) -> str | None:
    """The summary status of a run stopped by `signum`: `interrupted` (SIGINT) or `preempted`."""
    if signum is None:
        return None
    return "interrupted" if signum == signal.SIGINT else "preempted"


def exit_status(status: str) -> int:
    """The process exit status for a stopped run's summary status."""
    return EXIT_INTERRUPTED if status == "interrupted" else EXIT_PREEMPTED


class StopRequest:
    """Installs handlers for SIGUSR2, SIGTERM and SIGINT that record the signal; use as a context.

    `signum` is the signal this process received; `agreed` (set by `requested`) the one that
    stops the run, from whichever process received it.
    """

    def __init__(self):
        self.signum = None
        self.agreed = None
        self.saved_step = None  # the step whose checkpoint the stop saved (`checkpoint_saved`)
        self._previous = {}

    def __enter__(self):
        for sig in SIGNALS:
            try:
                self._previous[sig] = signal.signal(sig, self._record)
            except ValueError:  # not the main thread (e.g. some launchers): no handlers
                pass
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
        return False

    def _record(self, signum, frame):
        if signum == signal.SIGINT and self.signum == signal.SIGINT:
            # A second Ctrl-C: the user does not want to wait for the step boundary. Leave at
            # once: an exception raised here could land in any frame (a finally block, a
            # callback from XLA) and end as a traceback instead of this sentence.
            sentence = SECOND_INTERRUPT if self.saved_step is None else SECOND_INTERRUPT_SAVED.format(step=self.saved_step)
            print(sentence, file=sys.stderr, flush=True)
            os._exit(EXIT_INTERRUPTED)
        if self.signum is None:
            self.signum = signum

    def checkpoint_saved(self, step: int):
        """Records that the stop's checkpoint (of `step`) is written: a second Ctrl-C says so."""
        self.saved_step = step

    def requested(self) -> bool:
        """True on every process when any process has received a stop signal."""
        if distributed.process_count() == 1:
            self.agreed = self.signum
        else:
            received = distributed.allgather(np.array([self.signum or 0]))
            received = [int(s) for s in np.ravel(received) if s]
            self.agreed = received[0] if received else None
        return self.agreed is not None

    @property
    def status(self) -> str | None:
        """`interrupted` or `preempted` once `requested` has returned True, else None."""
        return status_of(self.agreed)

    def describe(self) -> str | None:
        """The stop signal's name, e.g. `SIGTERM`."""
        return signal.Signals(self.agreed).name if self.agreed else None

    def hand_over(self):
        """After the checkpoint: let submitit requeue the job (its SIGUSR2 handler, rank 0)."""
        previous = self._previous.get(self.signum)
        if self.signum == signal.SIGUSR2 and callable(previous):
            previous(self.signum, None)
