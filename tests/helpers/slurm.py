"""Whether the local SLURM (`make slurm-up`) answers: the reason its tests are skipped, or None."""

import functools
import os
import shutil
import subprocess


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
