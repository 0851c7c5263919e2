"""runner.run logs as the CLI does (issue 56, item 7): progress and health warnings to stderr and
RUN_DIR/cli.log, through handlers that last the call only; quiet=True prints nothing, the progress
bar included."""

import io
import logging
import sys

import pytest

import runner
from runner import cli
from runner.errors import ConfigError, RunFailed

SMALL = ["hilbert.L=6", "sampler.n_samples=64", "sampler.n_chains=8", "n_iter=3", "final_rounds=1", "exact=false",
         "peak_search=0"]


def test_the_cli_log_is_named_as_hydra_names_the_cli_job():
    from hydra._internal.utils import detect_task_name

    assert cli.LOG_FILE == f"{detect_task_name(cli.__file__, None)}.log" == "cli.log"


def test_run_logs_like_the_cli_once_per_call(tmp_path, capsys):
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    run_dir = tmp_path / "run"
    runner.run(SMALL, run_dir=run_dir)
    err = capsys.readouterr().err
    log = (run_dir / cli.LOG_FILE).read_text()
    for text in (err, log):
        assert "run directory:" in text and "[runner.app][INFO] - " in text
    assert root.handlers == handlers and root.level == level  # nothing left behind
    # a second call (a notebook's): its lines once, and appended to the same log
    runner.run([*SMALL, "n_iter=4"], run_dir=run_dir)
    err = capsys.readouterr().err
    assert err.count("run directory:") == 1
    assert (run_dir / cli.LOG_FILE).read_text().count("run directory:") == 2


def test_quiet_run_prints_nothing_and_still_logs(tmp_path, capsys):
    runner.run(SMALL, run_dir=tmp_path / "quiet", quiet=True)
    assert "run directory:" not in capsys.readouterr().err
    assert "run directory:" in (tmp_path / "quiet" / cli.LOG_FILE).read_text()


class Terminal(io.StringIO):
    """stderr as a terminal (tqdm draws its bar only on one)."""

    def isatty(self):
        return True


@pytest.mark.parametrize("quiet", [False, True])
def test_the_progress_bar_is_printed_where_the_log_is(tmp_path, monkeypatch, quiet):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    runner.run(SMALL, run_dir=tmp_path / "run", quiet=quiet)
    printed = terminal.getvalue()
    assert ("run directory:" in printed) == (not quiet)
    assert ("3/3" in printed) == (not quiet)  # the bar's count of the 3 steps


def test_a_config_error_leaves_no_log(tmp_path):
    with pytest.raises(ConfigError, match="n_iter"):
        runner.run([*SMALL, "n_iter=-1"], run_dir=tmp_path / "bad" / "run")
    assert not (tmp_path / "bad").exists()


def test_warnings_reach_stderr_and_the_log(tmp_path, capsys):
    run_dir = tmp_path / "warned"
    runner.run(["hilbert.L=6", "sampler=full_sum", "sampler.n_samples=64", "n_iter=2", "exact=false", "peak_search=0"],
               run_dir=run_dir)
    err = capsys.readouterr().err
    for text in (err, (run_dir / cli.LOG_FILE).read_text()):
        assert "[WARNING] - sampler.n_samples=64 is not used by full_sum" in text


def test_a_failed_run_raises_run_failed_not_system_exit(tmp_path):
    """From Python a failed run is an exception carrying its summary (the CLI exits 1 for it), and a
    run directory this config cannot continue is a ConfigError (the CLI's exit 2): no SystemExit."""
    diverging = ["hilbert.L=8", "sampler.n_samples=256", "sampler.n_chains=8", "final_rounds=1", "exact=false",
                 "n_iter=20", "optimizer.learning_rate=1e6"]
    with pytest.raises(RunFailed) as failed:
        runner.run(diverging, run_dir=tmp_path / "nan", quiet=True)
    assert failed.value.status == "failed" and failed.value.summary["reason"].startswith("energy is nan")
    runner.run(["hilbert.L=6", "n_iter=2", "final_rounds=1", "exact=false"], run_dir=tmp_path / "done", quiet=True)
    (tmp_path / "done" / "checkpoint" / "state.npz").unlink()
    (tmp_path / "done" / "checkpoint" / "state.prev.npz").unlink(missing_ok=True)
    with pytest.raises(ConfigError, match="no checkpoint"):
        runner.run(["hilbert.L=6", "n_iter=4", "final_rounds=1", "exact=false"], run_dir=tmp_path / "done", quiet=True)
