"""Golden runs: a handful of configurations whose metrics and summaries must stay bit for bit.

`python tests/helpers/golden.py record` writes them (with the machine they were made on) under
tests/integration/golden/; tests/integration/test_golden.py reruns them with today's code.
"""

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1] / "integration" / "golden"
# The commit the golden files were recorded at: the layout before runner/ was split by concern.
COMMIT = "6dc7890"

CASES = {
    "default_tfim": [],
    "heisenberg_complex_cg": [
        "hilbert=square", "hilbert.L=4", "hilbert.total_sz=0", "hamiltonian=heisenberg", "dtype=complex128",
        "sampler=metropolis_exchange", "preconditioner.solver=cg", "n_iter=30", "observables=spin",
    ],
    "cnn_minsr": [
        "hilbert=square", "hilbert.L=4", "hilbert.total_sz=0", "hamiltonian=heisenberg", "model=cnn",
        "sampler=metropolis_exchange", "preconditioner=minsr", "sampler.n_samples=256", "n_iter=20",
    ],
    "sharded_2": ["parallel=sharded", "parallel.cpu_devices=2", "n_iter=50", "hilbert.L=12"],
    "full_sum": ["sampler=full_sum", "hilbert.L=10", "n_iter=50", "hamiltonian.h=0.5"],
}

# Fields that measure time, or record where the code lives, not what it computed.
VOLATILE = ("time", "seconds", "config_fingerprint")


def stable(record: dict) -> dict:
    """A metrics record or summary without its timings."""
    return {k: v for k, v in record.items() if not any(word in k for word in VOLATILE)}


def machine() -> dict:
    """What decides the last bits of a CPU run: the processor, the jax/numpy builds, the Python."""
    import jax
    import numpy

    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "flags")):
                flags += line.split(":", 1)[1].strip() + "\n"
                if line.startswith("flags"):
                    break
    except OSError:
        flags = platform.processor()
    return {"cpu": flags, "jax": jax.__version__, "numpy": numpy.__version__, "python": platform.python_version()}


def run(code_dir: Path, overrides: list, run_dir: Path, records: str = "metrics.jsonl") -> tuple[list, dict]:
    """Runs `python -m runner` from `code_dir`'s code into `run_dir`; returns (its `records`, a time
    evolution's trajectory.jsonl, and summary), stable."""
    env = {**os.environ, "PYTHONPATH": str(code_dir), "HYDRA_FULL_ERROR": "1"}
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run([sys.executable, "-m", "runner", *overrides, f"hydra.run.dir={run_dir}"],
                          cwd=code_dir, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{overrides} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    metrics = [stable(json.loads(line)) for line in (run_dir / records).read_text().splitlines()]
    summary = stable(json.loads((run_dir / "summary.json").read_text()))
    return metrics, summary


def load(name: str) -> tuple[list, dict]:
    """The recorded (metrics, summary) of one case."""
    metrics = [json.loads(line) for line in (HERE / name / "metrics.jsonl").read_text().splitlines()]
    return metrics, json.loads((HERE / name / "summary.json").read_text())


def record(code_dir: Path, scratch: Path) -> None:
    """Runs every case with `code_dir`'s code and writes the golden files."""
    for name, overrides in CASES.items():
        metrics, summary = run(code_dir, overrides, scratch / name)
        out = HERE / name
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
        (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        print(name, summary.get("energy"), flush=True)
    (HERE / "machine.json").write_text(json.dumps({"commit": COMMIT, **machine()}, indent=1) + "\n")


if __name__ == "__main__":
    import tempfile

    assert sys.argv[1:2] == ["record"], "usage: golden.py record [CODE_DIR]"
    code = Path(sys.argv[2] if len(sys.argv) > 2 else Path(__file__).parents[2]).resolve()
    with tempfile.TemporaryDirectory() as scratch:
        record(code, Path(scratch))
