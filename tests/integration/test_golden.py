"""The golden runs and the run directories written at 6dc7890 and bcc302d: today's code gives the same bits.

Bits are compared on the machine the golden files were recorded on (tests/integration/golden/
machine.json). Elsewhere the reference is made on this machine by running the code of that commit
(`git archive`), so the comparison stays bit for bit and never depends on another CPU's last digits.
"""

import functools
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from runner.lifecycle import finish, sector_check
from runner.outputs import summary as summary_fields
from tests.helpers import golden

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = golden.HERE / "run_6dc7890"
RESUME = ["n_iter=20", "checkpoint_every=5", "hilbert.L=8", "observables=spin"]  # its overrides, longer
# A time evolution written at bcc302d, when the integrator and the TDVP were flat task keys (task.dt,
# task.integrator: rk4, task.propagation, ...), to t = 0.04; its overrides in today's spelling, to t = 0.08.
DYNAMICS = golden.HERE / "run_bcc302d_dynamics"
DYNAMICS_RESUME = ["task=dynamics", "hilbert.L=6", "hamiltonian.h=0.5", "model=jastrow", "dtype=complex128",
                   "sampler.n_samples=128", "observables=spin", "task.t_end=0.08", "task.integrator.dt=0.01",
                   "task.save_every=0.02"]

pytestmark = pytest.mark.slow


def _same_machine() -> bool:
    recorded = json.loads((golden.HERE / "machine.json").read_text())
    return all(recorded[k] == v for k, v in golden.machine().items())


@functools.cache
def _old_code(scratch: Path) -> Path:
    """The code of golden.COMMIT, unpacked under `scratch` (skips where git or the commit is missing)."""
    out = scratch / f"code_{golden.COMMIT}"
    if not out.exists():
        archive = subprocess.run(["git", "archive", golden.COMMIT], cwd=ROOT, capture_output=True)
        if archive.returncode != 0:
            pytest.skip(f"not the recording machine and commit {golden.COMMIT} is not in this clone")
        out.mkdir(parents=True)
        (scratch / "code.tar").write_bytes(archive.stdout)
        with tarfile.open(scratch / "code.tar") as tar:
            tar.extractall(out, filter="data")
    return out


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("golden")


@pytest.mark.parametrize("name", sorted(golden.CASES))
def test_golden_run_is_bit_for_bit(name, scratch):
    metrics, summary = golden.run(ROOT, golden.CASES[name], scratch / name)
    if _same_machine():
        expected = golden.load(name)
    else:
        expected = golden.run(_old_code(scratch), golden.CASES[name], scratch / f"{name}_reference")
    assert metrics == expected[0]
    _same_summary(summary, expected[1])


def _same_summary(summary: dict, expected: dict):
    """Every recorded field bit for bit; fields added since (the symmetry sectors', the exact
    observables', the per-site and unit fields, `unreliable`) only."""
    added = (*sector_check.FIELDS, *finish.EXACT_FIELDS, *summary_fields.UNIT_FIELDS, *summary_fields.HEALTH_FIELDS)
    assert set(summary) - set(expected) <= set(added)
    assert {k: summary[k] for k in expected if k in summary} == expected
    assert set(expected) <= set(summary)


def _resume(code: Path, run_dir: Path):
    shutil.copytree(FIXTURE / "run", run_dir)
    return golden.run(code, RESUME, run_dir)


def test_run_directory_of_6dc7890_resumes_bit_for_bit(scratch):
    metrics, summary = _resume(ROOT, scratch / "resumed")
    assert [m["step"] for m in metrics] == list(range(20))  # continued from its checkpoint at step 10
    assert summary["status"] == "completed" and summary["steps_done"] == 20
    if _same_machine():
        expected_metrics = [json.loads(line) for line in (FIXTURE / "resumed_metrics.jsonl").read_text().splitlines()]
        expected_summary = json.loads((FIXTURE / "resumed_summary.json").read_text())
    else:
        expected_metrics, expected_summary = _resume(_old_code(scratch), scratch / "resumed_reference")
    assert metrics == expected_metrics
    _same_summary(summary, expected_summary)


def test_dynamics_run_directory_of_flat_task_keys_resumes_as_a_fresh_run(scratch):
    """Its checkpoint at t = 0.04 resumes (the stored fingerprint read in today's spelling:
    fingerprint.UPGRADES) and continues to t = 0.08 with the trajectory and summary of a fresh run.

    The stored rows and checkpoint were computed at bcc302d on another processor, so a fresh run
    today agrees with them in value, not in every last bit (a CI run once differed in the 16th
    digit of the t = 0 residual): numbers are compared to 1e-9 relative, everything else exactly.
    Resumes of today's checkpoints are bit for bit (tests/lifecycle/test_dynamics.py)."""
    shutil.copytree(DYNAMICS / "run", scratch / "dynamics_resumed")
    stored = [golden.stable(json.loads(line)) for line in (DYNAMICS / "run" / "trajectory.jsonl").read_text().splitlines()]
    resumed, summary = golden.run(ROOT, DYNAMICS_RESUME, scratch / "dynamics_resumed", "trajectory.jsonl")
    fresh, fresh_summary = golden.run(ROOT, DYNAMICS_RESUME, scratch / "dynamics_fresh", "trajectory.jsonl")
    assert [r["t"] for r in resumed] == [0.0, 0.02, 0.04, 0.06, 0.08] and resumed[:3] == stored
    assert len(resumed) == len(fresh) and all(_close(r, f) for r, f in zip(resumed, fresh))
    assert _close(summary, fresh_summary) and summary["status"] == "completed"


def _close(record: dict, expected: dict) -> bool:
    """The same keys; floats within 1e-9 relative (1e-12 absolute), every other value equal."""
    def same(a, b):
        if isinstance(a, float) and isinstance(b, float):
            return a == pytest.approx(b, rel=1e-9, abs=1e-12)
        if isinstance(a, dict) and isinstance(b, dict):
            return _close(a, b)
        return a == b
    return record.keys() == expected.keys() and all(same(record[k], expected[k]) for k in record)
