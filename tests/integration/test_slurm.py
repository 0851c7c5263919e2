"""End to end on a real SLURM (`make slurm-up`): sweeps through the submitit launcher, multi-process
and multi-node jobs, sweep resume, failure visibility, cancellation and preemption.

Skipped unless `sinfo` answers and SLURM_CONF is set (`eval "$(make -s slurm-env)"`). Every test
uses a fresh sweep directory and its own job name (a fresh slurmctld restarts job ids at 1, so a
reused submitit folder could hand back a stale result), cancels its jobs when it ends, and has a
time limit.
"""

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from runner import report
from tests.helpers.slurm import slurm_unavailable


_REASON = slurm_unavailable()
if _REASON is not None and os.environ.get("VMC_REQUIRE_SLURM") == "1":
    raise RuntimeError(f"VMC_REQUIRE_SLURM=1 but SLURM is not usable: {_REASON}")  # CI: no silent skip
pytestmark = [pytest.mark.slurm, pytest.mark.skipif(_REASON is not None, reason=str(_REASON))]

# 2 JAX processes on a 2-core machine: keep every job tiny.
TINY = ["hilbert.L=8", "sampler.n_samples=256", "sampler.n_chains=8", "final_rounds=1", "exact=false"]
LIMIT_S = 240  # default per-test limit; the whole SLURM part aims at < 5 min


@pytest.fixture(autouse=True)
def time_limit(request):
    """Fails a test that runs longer than its limit (SIGALRM; pytest-timeout is not a dependency)."""
    limit = getattr(request.function, "limit_s", LIMIT_S)

    def expire(signum, frame):
        pytest.fail(f"{request.node.name} took longer than {limit} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(limit)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def limit(seconds):
    def mark(fn):
        fn.limit_s = seconds
        return fn

    return mark


class Sweep:
    """A sweep directory and job name of its own; `run`/`start` launch `python -m runner -m ...`."""

    def __init__(self, path: Path):
        self.dir = path
        self.name = f"vmc-test-{uuid.uuid4().hex[:8]}"
        self.procs = []

    def args(self, overrides, launcher="slurm"):
        return [sys.executable, "-m", "runner", "-m", f"hydra/launcher={launcher}", f"hydra.sweep.dir={self.dir}",
                f"hydra.launcher.name={self.name}", *TINY, *overrides]

    def start(self, *overrides, launcher="slurm", env=None):
        proc = subprocess.Popen(self.args(overrides, launcher), cwd=self.dir.parent, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env={**os.environ, **(env or {})})
        self.procs.append(proc)
        return proc

    def run(self, *overrides, launcher="slurm", env=None, timeout=180):
        proc = self.start(*overrides, launcher=launcher, env=env)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.cancel()
            out, _ = proc.communicate(timeout=60)
            raise AssertionError(f"the sweep did not finish within {timeout} s:\n{out[-4000:]}") from None
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")

    def run_dirs(self):
        return sorted(p.parent for p in self.dir.glob("*/.hydra"))

    def summaries(self):
        return [json.loads((d / "summary.json").read_text()) for d in self.run_dirs()]

    def job_ids(self, states="PENDING,RUNNING,REQUEUED,COMPLETING"):
        out = subprocess.run(["squeue", "-h", "-n", self.name, "-t", states, "-o", "%i"], capture_output=True,
                             text=True, timeout=20)
        return out.stdout.split()

    def logs(self, pattern="*"):
        """Every per-task submitit log of this sweep, concatenated."""
        return "".join(p.read_text(errors="replace") for p in sorted(self.dir.glob(f".submitit/*/{pattern}")))

    def cancel(self):
        subprocess.run(["scancel", "-n", self.name], capture_output=True, timeout=20)

    def close(self):
        self.cancel()
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


@pytest.fixture
def sweep(tmp_path):
    s = Sweep(tmp_path / "sweep")
    yield s
    s.close()


@pytest.fixture
def sweep2(tmp_path):
    s = Sweep(tmp_path / "sweep2")
    yield s
    s.close()


def wait_for(predicate, timeout, what, poll=0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def n_nodes_up():
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, timeout=20).stdout
    return sum(line.split()[1].rstrip("*~#") in ("idle", "mixed") for line in out.splitlines())


def metrics_lines(run_dir):
    path = run_dir / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


@limit(180)
def test_sweep_of_two_process_jobs_and_report(sweep):
    proc = sweep.run("hydra.launcher.tasks_per_node=2", "parallel=multinode", "model.alpha=1,2", "n_iter=10")
    assert proc.returncode == 0, proc.stdout[-4000:]
    summaries = sweep.summaries()
    assert len(summaries) == 2
    for summary in summaries:
        assert summary["status"] == "completed"
        assert (summary["processes"], summary["devices"], summary["backend"]) == (2, 2, "multinode")
    rep = subprocess.run([sys.executable, "-m", "runner.report", str(sweep.dir)], capture_output=True, text=True,
                         timeout=120)
    assert rep.returncode == 0, rep.stderr
    rows = [line.split() for line in rep.stdout.splitlines()[2:4]]
    assert [r[:3] for r in rows] == [["1", "completed", "10/10"], ["2", "completed", "10/10"]]
    assert all(r[-2] == "2/2" for r in rows)  # procs/devs, then the warnings column
    assert (sweep.dir / "report.csv").read_text().count("\n") == 3


@limit(150)
def test_two_node_job_is_one_four_process_jax_run(sweep):
    if n_nodes_up() < 2:
        pytest.skip("needs two SLURM nodes: make slurm-down && SLURM_NODES=2 make slurm-up")
    proc = sweep.run("hydra.launcher.nodes=2", "hydra.launcher.tasks_per_node=2", "parallel=multinode", "n_iter=8")
    assert proc.returncode == 0, proc.stdout[-4000:]
    (summary,) = sweep.summaries()
    assert (summary["status"], summary["processes"], summary["devices"]) == ("completed", 4, 4)
    # The four tasks really were spread over both nodes.
    nodes = {line.split("node=")[1].split("(")[0] for line in sweep.logs("*_log.out").splitlines()
             if "Starting with JobEnvironment" in line}
    assert nodes == {"0", "1"}


@limit(200)
def test_rerun_of_a_sweep_skips_completed_runs_and_resumes_the_others(sweep):
    args = ("hydra.launcher.tasks_per_node=2", "parallel=multinode", "model.alpha=1,2", "n_iter=10")
    first = sweep.run(*args)
    assert first.returncode == 0, first.stdout[-4000:]
    done, killed = sweep.run_dirs()
    metrics = {d: (d / "metrics.jsonl").read_bytes() for d in (done, killed)}
    summary = (done / "summary.json").read_bytes()
    (killed / "summary.json").unlink()  # as if killed after its last checkpoint
    second = sweep.run(*args)
    assert second.returncode == 0, second.stdout[-4000:]
    assert "already completed" in (done / "cli.log").read_text()
    assert (done / "summary.json").read_bytes() == summary
    assert (done / "metrics.jsonl").read_bytes() == metrics[done]
    assert "resumed from checkpoint at step 10" in (killed / "cli.log").read_text()
    assert (killed / "metrics.jsonl").read_bytes() == metrics[killed]
    assert [s["status"] for s in sweep.summaries()] == ["completed", "completed"]


FAIL_ON_RANK = '''
import importlib.machinery, os, sys
if os.environ.get("SLURM_PROCID") == os.environ.get("VMC_TEST_FAIL_RANK"):
    class _FailAfterImport:
        """Makes runner.app.execute raise on this rank only (a test hook, not product code)."""
        def find_spec(self, name, path, target=None):
            if name != "runner.app":
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            run_module = spec.loader.exec_module
            def exec_module(module):
                run_module(module)
                def execute(*args, **kwargs):
                    raise RuntimeError("injected failure on rank " + os.environ["SLURM_PROCID"])
                module.execute = execute
            spec.loader.exec_module = exec_module
            return spec
    sys.meta_path.insert(0, _FailAfterImport())
'''


@limit(180)
def test_failure_on_a_non_zero_rank_is_reported_with_its_traceback(sweep, tmp_path):
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(FAIL_ON_RANK)
    env = {"PYTHONPATH": f"{hook}:{os.environ.get('PYTHONPATH', '')}", "VMC_TEST_FAIL_RANK": "1"}
    t = time.monotonic()
    proc = sweep.run("hydra.launcher.tasks_per_node=2", "parallel=multinode", "n_iter=20", env=env)
    elapsed = time.monotonic() - t
    assert proc.returncode != 0, proc.stdout[-4000:]
    assert elapsed < 150
    # Hydra's console log goes to the task's stdout: rank 1's traceback is in its submitit log
    # and in the run's job log (cli.log, shared by the ranks).
    rank1 = sweep.logs("*_1_log.*")
    assert "RuntimeError: injected failure on rank 1" in rank1 and "Traceback" in rank1
    (run_dir,) = sweep.run_dirs()
    assert "process 1 of 2 failed" in (run_dir / "cli.log").read_text()
    rep = subprocess.run([sys.executable, "-m", "runner.report", str(sweep.dir), "--no-plots"],
                         capture_output=True, text=True, timeout=60)
    assert rep.returncode == 0, rep.stderr
    assert rep.stdout.splitlines()[2].split()[1] == "failed"


@limit(150)
def test_cancelled_job_does_not_hang_the_sweep(sweep):
    proc = sweep.start("hydra.launcher.tasks_per_node=2", "parallel=multinode", "n_iter=100000",
                       "checkpoint_every=1000000")
    run_dir = wait_for(lambda: next(iter(sweep.run_dirs()), None), 90, "the run directory")
    wait_for(lambda: metrics_lines(run_dir) >= 3, 90, "the first steps")
    (job,) = sweep.job_ids()
    subprocess.run(["scancel", job], check=True, timeout=20)
    t = time.monotonic()
    try:
        out, _ = proc.communicate(timeout=100)
    except subprocess.TimeoutExpired:
        raise AssertionError("the sweep still waits 100 s after its job was cancelled") from None
    assert proc.returncode != 0
    assert time.monotonic() - t < 100
    # scancel sends SIGTERM first: the run stops at a step boundary like a preempted one.
    (row,) = report.collect(sweep.dir)
    assert row["status"] in ("preempted", "incomplete", "running")


@limit(300)
def test_requeued_job_resumes_and_ends_exactly_as_an_uninterrupted_run(sweep, sweep2):
    args = ("hydra.launcher.tasks_per_node=2", "parallel=multinode", "n_iter=300", "checkpoint_every=100000")
    interrupted = sweep.start(*args)
    reference = sweep2.start(*args)
    run_dir = wait_for(lambda: next(iter(sweep.run_dirs()), None), 90, "the run directory")
    wait_for(lambda: metrics_lines(run_dir) >= 20, 120, "20 steps")
    (job,) = sweep.job_ids("RUNNING")
    subprocess.run(["scontrol", "requeue", job], check=True, timeout=20)
    # SLURM holds a requeued job for ~120 s (BeginTime); release it at once.
    wait_for(lambda: job in sweep.job_ids("PENDING"), 60, "the job to be pending again", poll=0.2)
    subprocess.run(["scontrol", "update", f"jobid={job}", "StartTime=now"], check=True, timeout=20)
    out, _ = interrupted.communicate(timeout=200)
    assert interrupted.returncode == 0, out[-4000:]
    ref_out, _ = reference.communicate(timeout=100)
    assert reference.returncode == 0, ref_out[-4000:]
    log = (run_dir / "cli.log").read_text()
    # checkpoint_every is larger than n_iter: the only checkpoint is the one written on the signal
    assert "received: saving a checkpoint at step" in log  # "SIGTERM received: ..."
    assert "resumed from checkpoint at step" in log
    (summary,) = sweep.summaries()
    (ref,) = sweep2.summaries()
    assert summary["status"] == "completed" and summary["steps_done"] == 300
    assert summary["energy"] == ref["energy"]
    assert summary["energy_error"] == ref["energy_error"]


@limit(150)
def test_local_tasks_launcher_runs_a_two_process_job(sweep):
    """The same SPMD path without SLURM: submitit's local executor with two tasks."""
    proc = sweep.run("parallel=multinode", "model.alpha=1", "n_iter=6", launcher="local_tasks")
    assert proc.returncode == 0, proc.stdout[-4000:]
    (summary,) = sweep.summaries()
    assert (summary["status"], summary["processes"]) == ("completed", 2)
