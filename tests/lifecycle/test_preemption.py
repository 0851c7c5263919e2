"""runner.lifecycle.preemption: SIGTERM/SIGUSR2/SIGINT set a flag, a second Ctrl-C aborts, handlers are restored."""

import os
import signal

import pytest

from runner.lifecycle import preemption
from runner.lifecycle.preemption import StopRequest


def test_no_signal_no_request():
    with StopRequest() as stop:
        assert not stop.requested()
        assert stop.status is None and stop.describe() is None


@pytest.mark.parametrize("signum,status,exit_status", [
    (signal.SIGTERM, "preempted", 3),
    (signal.SIGUSR2, "preempted", 3),
    (signal.SIGINT, "interrupted", 130),
])
def test_a_signal_only_sets_the_flag(signum, status, exit_status):
    with StopRequest() as stop:
        os.kill(os.getpid(), signum)  # without the handler: SIGTERM/SIGUSR2 kill pytest, SIGINT raises
        assert stop.requested()
        assert stop.status == status and stop.describe() == signal.Signals(signum).name
    assert preemption.exit_status(status) == exit_status


def test_the_first_signal_names_the_stop():
    with StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested() and stop.status == "preempted"


def test_second_ctrl_c_aborts_at_once():
    """The second SIGINT leaves from the handler itself: its sentence, exit 130, no traceback
    (in a subprocess: it ends the process)."""
    import subprocess
    import sys

    script = ("import os, signal, time\n"
              "from runner.lifecycle.preemption import StopRequest\n"
              "with StopRequest() as stop:\n"
              "    os.kill(os.getpid(), signal.SIGINT)\n"
              "    assert stop.requested() and stop.status == 'interrupted'\n"
              "    os.kill(os.getpid(), signal.SIGINT)\n"
              "    time.sleep(10)\n"
              "print('not reached')\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.strip() == preemption.SECOND_INTERRUPT and proc.stdout == ""


def test_handlers_are_restored():
    before = {sig: signal.getsignal(sig) for sig in preemption.SIGNALS}
    with StopRequest():
        assert all(signal.getsignal(sig) != before[sig] for sig in preemption.SIGNALS)
    assert {sig: signal.getsignal(sig) for sig in preemption.SIGNALS} == before


def test_hand_over_calls_the_previous_sigusr2_handler_only():
    called = []
    previous = signal.signal(signal.SIGUSR2, lambda signum, frame: called.append(signum))
    try:
        with StopRequest() as stop:
            os.kill(os.getpid(), signal.SIGTERM)
            stop.hand_over()  # SIGTERM: nothing to hand over
            assert called == []
        with StopRequest() as stop:
            os.kill(os.getpid(), signal.SIGUSR2)
            assert stop.requested()
            stop.hand_over()  # submitit's handler (here: ours) requeues the job
        assert called == [signal.SIGUSR2]
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_second_ctrl_c_after_the_checkpoint_says_it_was_saved():
    """After the first Ctrl-C's checkpoint is written, the second one's sentence names its step
    (the summary's "after saving a checkpoint" then holds too)."""
    import subprocess
    import sys

    script = ("import os, signal, time\n"
              "from runner.lifecycle.preemption import StopRequest\n"
              "with StopRequest() as stop:\n"
              "    os.kill(os.getpid(), signal.SIGINT)\n"
              "    assert stop.requested()\n"
              "    stop.checkpoint_saved(7)\n"
              "    os.kill(os.getpid(), signal.SIGINT)\n"
              "    time.sleep(10)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.strip() == preemption.SECOND_INTERRUPT_SAVED.format(step=7)
    assert "step 7" in proc.stderr and "without" not in proc.stderr
