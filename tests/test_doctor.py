"""runner.doctor on healthy and broken setups, and the proxy work-around of the runner."""

import json
import os
import subprocess
import sys

import pytest

from runner.doctor import Report, check_proxies
from runner.parallel import distributed
from tests.helpers.cli import REPO
from tests.helpers.parallel import free_port, start_distributed


def doctor(args, env=None, timeout=120):
    full_env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    return subprocess.run([sys.executable, "-m", "runner.doctor", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env={**full_env, **(env or {})})


def test_healthy_sharded_setup():
    proc = doctor(["parallel=sharded", "parallel.cpu_devices=4"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for text in ("jax 0.", "process 0 of 1", "4 device(s) in all", "reduction over 4 devices", "x64 on",
                 "everything looks right"):
        assert text in proc.stdout


def test_wildcard_no_proxy_is_explained_not_hung():
    proc = doctor(["parallel=distributed", "parallel.num_processes=2"],
                  env={"http_proxy": "http://proxy.example:3128", "no_proxy": "10.0.0.*"}, timeout=60)
    assert proc.returncode == 1
    assert "10.0.0.*" in proc.stdout and "wildcards" in proc.stdout and "fix:" in proc.stdout


def test_two_process_doctor_runs_a_real_reduction():
    port = free_port()
    args = ["parallel=distributed", f"parallel.coordinator_address=127.0.0.1:{port}", "parallel.num_processes=2",
            "parallel.cpu_devices=2", "parallel.init_timeout_s=60"]
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    procs = [subprocess.Popen([sys.executable, "-m", "runner.doctor", *args, f"parallel.process_id={i}"],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for i in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert all("reduction over 4 devices in 2 process(es) gives 10" in out for out in outs), outs


def test_proxy_checks_and_bypass():
    report = Report()
    assert check_proxies("127.0.0.1", report, env={})
    assert check_proxies("127.0.0.1", report, env={"https_proxy": "http://p:1", "no_proxy": "localhost,127.0.0.0/8"})
    assert not check_proxies("127.0.0.1", report, env={"https_proxy": "http://p:1", "no_proxy": "127.0.0.*"})
    assert report.problems == 2  # the wildcard, and the host it fails to cover
    env = {"http_proxy": "http://p:1", "no_proxy": "10.0.0.*"}
    distributed.bypass_proxy("node1", env)
    assert env["no_proxy"] == "10.0.0.*,node1" and env["NO_PROXY"] == "node1"
    assert distributed.coordinator_host({"backend": "multinode"}, {"SLURM_STEP_NODELIST": "gpu[03-04],x"}) == "gpu03"


@pytest.mark.slow
def test_runner_survives_a_wildcard_no_proxy(tmp_path):
    """A proxy that does not exist plus `no_proxy=10.0.0.*` would hang gRPC; the runner bypasses it."""
    env = {"http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9", "no_proxy": "10.0.0.*"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        procs = start_distributed(["hilbert.L=6", "n_iter=3", "sampler.n_samples=64", "sampler.n_chains=8",
                                   "final_rounds=1"], tmp_path, free_port())
        outs = [p.communicate(timeout=180)[0] for p in procs]
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    assert [p.returncode for p in procs] == [0, 0], outs
    assert json.loads((tmp_path / "summary.json").read_text())["processes"] == 2


def test_help_is_a_usage_text_and_bad_arguments_one_sentence():
    proc = doctor(["--help"])
    assert proc.returncode == 0 and "Traceback" not in proc.stderr
    assert proc.stdout.startswith("usage: python -m runner.doctor [overrides]")
    for args in (["--verbose"], ["model.nonexistent=3"], ["hilbert.L=["]):
        proc = doctor(args)
        assert proc.returncode == 2, (args, proc.stderr)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("Config error:"), (args, proc.stderr)
