"""Whether the local SLURM (`make slurm-up`) answers: the reason its tests are skipped, or None; and one test at a
time on it."""

import contextlib
import fcntl
import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path


@functools.cache
def slurm_unavailable() -> str | None:
    if not shutil.which("sinfo"):
        return "sinfo not found (no SLURM client; start the local one with `make slurm-up`)"
    if not os.environ.get("SLURM_CONF"):
        return 'SLURM_CONF is not set (run `eval "$(make -s slurm-env)"` after `make slurm-up`)'
    try:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "sinfo did not answer within 20 s"
    if out.returncode != 0:
        return f"sinfo failed: {out.stderr.strip()[:200]}"
    if not any(line.split()[1].rstrip("*~#") in ("idle", "mixed", "allocated") for line in out.stdout.splitlines()):
        return f"no SLURM node is up: {out.stdout.strip()!r}"
    return None


@contextlib.contextmanager
def one_user():
    """Holds the local SLURM for the caller alone among the test processes of this machine (an exclusive lock
    on a file beside the temporary directory): under `pytest -n 2` two modules' jobs would share its two nodes,
    and one's jobs wait behind the other's past their time limits."""
    path = Path(tempfile.gettempdir()) / "vmc-runner-slurm-tests.lock"
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
