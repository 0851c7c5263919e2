"""A run directory: records without a checkpoint are refused, resume=false moves them aside, a
corrupt checkpoint is one sentence (issue 56 items 1 and 2)."""

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from runner.errors import ConfigError
from runner.lifecycle import checkpoint, rundir
from tests.helpers.cli import REPO, run_cli

TINY = ["hilbert.L=4", "n_iter=4", "sampler.n_samples=64"]


def _settings(resume=True):
    return SimpleNamespace(resume=resume, fingerprint={}, n_iter=4, task=None)


def test_records_without_checkpoint_are_refused(tmp_path):
    (tmp_path / rundir.METRICS).write_text('{"step": 0}\n')
    with pytest.raises(ConfigError, match="no checkpoint") as err:
        rundir.check_run_dir(tmp_path, _settings())
    assert "metrics.jsonl" in err.value.sentence() and err.value.sentence().count(".") >= 1
    assert rundir.resumable(tmp_path, _settings(resume=False)) is False


def test_empty_or_config_error_directory_is_not_refused(tmp_path):
    (tmp_path / rundir.METRICS).write_text("")
    (tmp_path / rundir.SUMMARY).write_text(json.dumps({"status": "failed", "reason": "config", "error": "x"}))
    assert rundir.run_records(tmp_path) == []
    rundir.check_run_dir(tmp_path, _settings())


def test_move_aside_keeps_the_records(tmp_path):
    (tmp_path / rundir.METRICS).write_text('{"step": 0}\n')
    (tmp_path / rundir.SUMMARY).write_text("{}")
    checkpoint.save(tmp_path / rundir.CHECKPOINT, {"a": np.zeros(2)}, {"step": 1})
    aside = rundir.move_aside(tmp_path)
    assert aside.parent == tmp_path and aside.name.startswith(rundir.REPLACED_PREFIX)
    assert (aside / rundir.METRICS).read_text() == '{"step": 0}\n'
    assert checkpoint.exists(aside / rundir.CHECKPOINT)
    assert not (tmp_path / rundir.METRICS).exists() and not (tmp_path / rundir.SUMMARY).exists()
    assert rundir.move_aside(tmp_path) is None


def _run(run_dir, *extra):
    return run_cli([*TINY, f"hydra.run.dir={run_dir}", *extra], cwd=REPO)


def test_cli_refuses_a_run_whose_checkpoint_is_missing_and_resume_false_moves_it_aside(tmp_path):
    run_dir = tmp_path / "run"
    assert _run(run_dir).returncode == 0
    for name in (checkpoint.FILENAME, checkpoint.PREVIOUS):
        (run_dir / rundir.CHECKPOINT / name).unlink(missing_ok=True)
    before = (run_dir / rundir.METRICS).read_text()
    proc = _run(run_dir, "n_iter=6")
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Config error:")]
    assert len(errors) == 1 and "no checkpoint" in errors[0] and "Traceback" not in proc.stderr
    assert (run_dir / rundir.METRICS).read_text() == before
    proc = _run(run_dir, "n_iter=6", "resume=false")
    assert proc.returncode == 0, proc.stderr
    aside = [p for p in run_dir.iterdir() if p.name.startswith(rundir.REPLACED_PREFIX)]
    assert len(aside) == 1 and (aside[0] / rundir.METRICS).read_text() == before
    assert len((run_dir / rundir.METRICS).read_text().splitlines()) == 6


def test_cli_corrupt_checkpoint_is_one_sentence(tmp_path):
    run_dir = tmp_path / "run"
    assert _run(run_dir).returncode == 0
    (run_dir / rundir.CHECKPOINT / checkpoint.PREVIOUS).unlink(missing_ok=True)  # no fallback left
    (run_dir / rundir.CHECKPOINT / checkpoint.FILENAME).write_bytes(np.random.default_rng(0).bytes(4096))
    proc = _run(run_dir, "n_iter=6")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "allow_pickle" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Config error:")]
    assert len(errors) == 1 and "state.npz" in errors[0] and "corrupt" in errors[0]
    import runner
    with pytest.raises(checkpoint.CorruptCheckpoint, match="state.npz is unreadable"):
        runner.load(run_dir)


def test_cli_resumes_from_the_previous_checkpoint_when_the_newest_is_corrupt(tmp_path):
    run_dir = tmp_path / "run"
    assert _run(run_dir, "checkpoint_every=2").returncode == 0
    assert checkpoint.read_meta(run_dir / rundir.CHECKPOINT)["step"] == 4
    newest = run_dir / rundir.CHECKPOINT / checkpoint.FILENAME
    newest.write_bytes(newest.read_bytes()[:300])  # truncated
    proc = _run(run_dir, "checkpoint_every=2", "n_iter=6")
    assert proc.returncode == 0, proc.stderr
    assert f"checkpoint {newest} is unreadable" in proc.stdout + proc.stderr
    steps = [json.loads(line)["step"] for line in (run_dir / rundir.METRICS).read_text().splitlines()]
    assert steps == list(range(6))
