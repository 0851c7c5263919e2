"""The runner as a subprocess: `python -m runner` and `python -m runner.evaluate` from the repository."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_cli(args, cwd, timeout=300, env=None, check=False):
    """Runs `python -m runner ARGS` in a subprocess; returns CompletedProcess."""
    full_env = {**os.environ, "HYDRA_FULL_ERROR": "0", **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "runner", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"runner failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def run_evaluate(args, timeout=300):
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    return subprocess.run([sys.executable, "-m", "runner.evaluate", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env=env)


def evaluated(run_dir, overrides):
    """evaluation.json of `python -m runner.evaluate RUN_DIR OVERRIDES`, which must succeed."""
    proc = run_evaluate([run_dir, *overrides])
    assert proc.returncode == 0, proc.stderr
    return json.loads((run_dir / "evaluation.json").read_text())
