"""Preemption: a signal only sets a flag; the run loop stops cleanly at a step boundary.

SLURM sends SIGTERM to every task on preemption or `scontrol requeue`; submitit sends SIGUSR2
to global rank 0 only, shortly before the time limit. Either way every process must agree to
stop at the same step (they take part in the checkpoint's collectives together), so the flag
is combined over processes at each step boundary.
"""

import signal

import jax
import numpy as np

SIGNALS = (signal.SIGUSR2, signal.SIGTERM)
EXIT_PREEMPTED = 3  # exit status of a run stopped by a signal after saving its checkpoint


class StopRequest:
    """Installs handlers for SIGUSR2 and SIGTERM that record the signal; use as a context."""

    def __init__(self):
        self.signum = None
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
        return False

    def _record(self, signum, frame):
        self.signum = signum

    def requested(self) -> bool:
        """True on every process when any process has received a stop signal."""
        flag = self.signum is not None
        if jax.process_count() == 1:
            return flag
        from jax.experimental import multihost_utils

        return bool(np.any(multihost_utils.process_allgather(np.array([flag]))))

    def hand_over(self):
        """After the checkpoint: let submitit requeue the job (its SIGUSR2 handler, rank 0)."""
        previous = self._previous.get(self.signum)
        if self.signum == signal.SIGUSR2 and callable(previous):
            previous(self.signum, None)
