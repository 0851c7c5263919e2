"""runner.app through the CLI: config-checked resume and skip, the shared exact energy, config errors,
stop signals, failure reasons, health warnings, sweeps with a bad point."""

import json
import shutil

import numpy as np
import pytest

from runner.errors import RunFailed
from tests.helpers.cli import REPO, run_cli

# ---------------------------------------------------------------------------------------------
# Resume and "already completed" prove the run directory holds this config's run (APP-A)

RUN = ["hilbert.L=8", "sampler.n_samples=256", "sampler.n_chains=8", "final_rounds=1", "exact=false",
       "checkpoint_every=100"]


def energies(run_dir):
    return [json.loads(line)["energy"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def summary_of(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


def one_error_line(proc):
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("Config error:"), proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A completed 4-step run; tests work on copies of it."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    run_cli([*RUN, "n_iter=4", f"hydra.run.dir={run_dir}"], REPO, check=True)
    return run_dir


@pytest.fixture(scope="module")
def six_steps(tmp_path_factory):
    """The same config run for 6 steps from scratch."""
    run_dir = tmp_path_factory.mktemp("six") / "run"
    run_cli([*RUN, "n_iter=6", f"hydra.run.dir={run_dir}"], REPO, check=True)
    return run_dir


def copy_of(run_dir, tmp_path):
    return shutil.copytree(run_dir, tmp_path / "run")


@pytest.mark.slow
def test_summary_and_checkpoint_record_the_fingerprint(finished):
    from runner.config import fingerprint
    from runner.lifecycle import checkpoint

    stamp = summary_of(finished)["config_fingerprint"]
    assert stamp["config"]["hamiltonian.h"] == 1.0 and stamp["config"]["seed"] == 0
    assert stamp["hash"] == fingerprint.digest(stamp["config"])
    assert checkpoint.read_meta(finished / "checkpoint")["config_fingerprint"] == stamp


@pytest.mark.parametrize(
    "change,expected",
    [
        ("hamiltonian.h=2.0", "hamiltonian.h is 2.0 in this config but 1.0 in the run stored in"),
        ("optimizer.learning_rate=0.05", "optimizer.learning_rate is 0.05 in this config but 0.02"),
        ("seed=3", "seed is 3 in this config but 0 in"),
    ],
)
@pytest.mark.slow
def test_rerun_with_another_config_is_refused_and_changes_nothing(finished, tmp_path, change, expected):
    run_dir = copy_of(finished, tmp_path)
    before = {p: p.read_bytes() for p in (run_dir / "summary.json", run_dir / "metrics.jsonl",
                                          run_dir / "checkpoint" / "state.npz")}
    # n_iter=4: the completed-run skip; n_iter=6: a resume from its checkpoint
    for n_iter in (4, 6):
        proc = run_cli([*RUN, change, f"n_iter={n_iter}", f"hydra.run.dir={run_dir}"], REPO)
        line = one_error_line(proc)
        assert expected in line and str(run_dir) in line and line.endswith("resume=false to start over."), line
        assert "already completed" not in proc.stdout + proc.stderr
    assert {p: p.read_bytes() for p in before} == before


def test_run_from_before_fingerprints_is_refused(finished, tmp_path):
    from runner.lifecycle import checkpoint

    run_dir = copy_of(finished, tmp_path)
    with np.load(run_dir / "checkpoint" / "state.npz") as data:
        leaves = [data[k] for k in sorted(data.files) if k.startswith("leaf_")]
        meta = json.loads(bytes(data["meta"]).decode())
    del meta["config_fingerprint"]
    checkpoint.save(run_dir / "checkpoint", leaves, meta)
    summary = summary_of(run_dir)
    del summary["config_fingerprint"]
    (run_dir / "summary.json").write_text(json.dumps(summary))
    for n_iter in (4, 6):
        line = one_error_line(run_cli([*RUN, f"n_iter={n_iter}", f"hydra.run.dir={run_dir}"], REPO))
        assert "before config fingerprints were recorded" in line and "resume=false" in line, line


@pytest.mark.slow
def test_resume_false_starts_over(finished, tmp_path):
    run_dir = copy_of(finished, tmp_path)
    proc = run_cli([*RUN, "n_iter=4", "seed=3", "resume=false", f"hydra.run.dir={run_dir}"], REPO, check=True)
    assert "resumed from checkpoint" not in proc.stdout + proc.stderr
    assert f"resume=false: replacing the completed run in {run_dir} (seed was 0, now 3)" in proc.stdout + proc.stderr
    assert summary_of(run_dir)["config_fingerprint"]["config"]["seed"] == 3
    assert len(energies(run_dir)) == 4 and energies(run_dir)[0] != energies(finished)[0]
    # and it is now that run: the same config resumes or skips, the old one is refused
    again = run_cli([*RUN, "n_iter=4", "seed=3", f"hydra.run.dir={run_dir}"], REPO, check=True)
    assert "already completed" in again.stdout + again.stderr
    assert "seed is 0 in this config but 3" in one_error_line(run_cli([*RUN, "n_iter=4", f"hydra.run.dir={run_dir}"], REPO))


@pytest.mark.slow
def test_extending_n_iter_resumes_and_matches_an_uninterrupted_run(finished, six_steps, tmp_path):
    run_dir = copy_of(finished, tmp_path)
    proc = run_cli([*RUN, "n_iter=6", f"hydra.run.dir={run_dir}"], REPO, check=True)
    assert "resumed from checkpoint at step 4" in proc.stdout + proc.stderr
    assert energies(run_dir) == energies(six_steps)
    assert summary_of(run_dir)["energy"] == summary_of(six_steps)["energy"]
    assert summary_of(run_dir)["config_fingerprint"] == summary_of(six_steps)["config_fingerprint"]


@pytest.mark.slow
def test_other_final_rounds_reestimates_instead_of_returning_the_old_summary(finished, tmp_path):
    run_dir = copy_of(finished, tmp_path)
    fresh = tmp_path / "fresh"
    proc = run_cli([*RUN, "n_iter=4", "final_rounds=2", f"hydra.run.dir={run_dir}"], REPO, check=True)
    assert "already completed" not in proc.stdout + proc.stderr
    run_cli([*RUN, "n_iter=4", "final_rounds=2", f"hydra.run.dir={fresh}"], REPO, check=True)
    assert energies(run_dir) == energies(finished)  # no step was run again
    assert summary_of(run_dir)["energy"] == summary_of(fresh)["energy"] != summary_of(finished)["energy"]


@pytest.mark.slow
def test_adding_observables_to_a_finished_run_measures_them_without_rerunning_steps(finished, tmp_path):
    run_dir = copy_of(finished, tmp_path)
    proc = run_cli([*RUN, "n_iter=4", "observables=spin", f"hydra.run.dir={run_dir}"], REPO, check=True)
    assert "already completed" not in proc.stdout + proc.stderr
    assert energies(run_dir) == energies(finished)  # no step was run again
    assert "mz2" in summary_of(run_dir)["observables"]


@pytest.mark.slow
def test_a_sweep_rerun_with_other_seeds_refuses_each_point_and_leaves_its_files(tmp_path):
    """Job directories named by job number only: re-running the sweep with new seeds finds the old
    seeds' runs there. Each point is refused in one sentence, the others still tried, exit 2."""
    sweep = ["-m", *RUN, "n_iter=2", f"hydra.sweep.dir={tmp_path}", "hydra.sweep.subdir=${hydra.job.num}"]
    run_cli([*sweep, "seed=0,1"], REPO, check=True)
    before = {p: p.read_bytes() for p in tmp_path.glob("*/summary.json")}
    proc = run_cli([*sweep, "seed=2,3"], REPO)
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Config error:")]
    assert len(errors) == 2 and "seed is 2 in this config but 0" in errors[0], proc.stderr
    assert "seed is 3 in this config but 1" in errors[1]
    assert "Traceback" not in proc.stderr
    assert {p: p.read_bytes() for p in tmp_path.glob("*/summary.json")} == before


# ---------------------------------------------------------------------------------------------
# The exact ground energy: process 0 computes it (or reads the sweep's cache) and shares it

SWEEP = ["hilbert.L=8", "sampler.n_samples=256", "sampler.n_chains=8", "final_rounds=1", "n_iter=2",
         "exact=true"]


def exact_log_lines(proc):
    lines = (proc.stdout + proc.stderr).splitlines()
    return ([line for line in lines if "exact ground energy" in line and "computed in" in line],
            [line for line in lines if "exact ground energy" in line and "from the sweep cache" in line])


@pytest.mark.slow
def test_sweep_computes_the_exact_energy_once_per_hamiltonian(tmp_path):
    proc = run_cli(["-m", *SWEEP, "optimizer.learning_rate=0.01,0.02", "seed=5", f"hydra.sweep.dir={tmp_path}"],
                   REPO, check=True)
    computed, cached = exact_log_lines(proc)
    assert (len(computed), len(cached)) == (1, 1), proc.stdout
    assert len(list((tmp_path / ".exact_cache").glob("*.json"))) == 1
    runs = sorted(p.parent for p in tmp_path.glob("*/summary.json"))
    assert len(runs) == 2 and all("seed=5" in run.name for run in runs)  # seed names the directory
    exact = {summary_of(run)["exact_energy"] for run in runs}
    assert len(exact) == 1

    # The same sweep directory with a new seed: a new run directory, the cached energy.
    proc = run_cli(["-m", *SWEEP, "optimizer.learning_rate=0.01", "seed=6", f"hydra.sweep.dir={tmp_path}"],
                   REPO, check=True)
    assert tuple(map(len, exact_log_lines(proc))) == (0, 1), proc.stdout
    runs = sorted(p.parent for p in tmp_path.glob("*/summary.json"))
    assert len(runs) == 3 and sum("seed=6" in run.name for run in runs) == 1
    assert {summary_of(run)["exact_energy"] for run in runs} == exact


@pytest.mark.slow
def test_sweep_over_the_field_computes_the_exact_energy_per_point(tmp_path):
    proc = run_cli(["-m", *SWEEP, "hamiltonian.h=0.5,1.5", f"hydra.sweep.dir={tmp_path}"], REPO, check=True)
    assert tuple(map(len, exact_log_lines(proc))) == (2, 0), proc.stdout
    assert len(list((tmp_path / ".exact_cache").glob("*.json"))) == 2
    exact = sorted(summary_of(p.parent)["exact_energy"] for p in tmp_path.glob("*/summary.json"))
    assert len(exact) == 2 and exact[0] < exact[1]  # h=1.5 lies lower


def test_only_process_0_computes_the_exact_energy(monkeypatch):
    import jax

    from runner.config.build import build
    from runner.lifecycle import finish
    from tests.helpers.config import compose_config

    experiment = build(compose_config(["hilbert.L=6", "exact=true"]))
    calls, sent = [], []
    monkeypatch.setattr(finish, "ground_state", lambda *args, **kw: calls.append(args) or (-7.25, None))
    monkeypatch.setattr(distributed, "broadcast_float", lambda x: sent.append(x) or -7.25)
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    assert finish.exact_energy(experiment, None) == -7.25 and calls == []  # received, not computed
    monkeypatch.setattr(jax, "process_index", lambda: 0)
    assert finish.exact_energy(experiment, None) == -7.25 and len(calls) == 1 and sent[-1] == -7.25


def test_broadcast_keeps_every_bit():
    x = -10.251661791031152
    assert distributed.broadcast_float(x) == x


@pytest.mark.slow
def test_two_processes_share_the_exact_energy(tmp_path):
    from tests.helpers.dense import dense_ising
    from tests.helpers.parallel import free_port, start_distributed

    overrides = ["hilbert.L=6", "n_iter=2", "sampler.n_samples=64", "sampler.n_chains=8", "final_rounds=1",
                 "exact=true"]
    procs = start_distributed(overrides, tmp_path, free_port())
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    expected = np.linalg.eigvalsh(dense_ising([(i, (i + 1) % 6) for i in range(6)], 6, 1.0, 1.0))[0]
    assert summary_of(tmp_path)["exact_energy"] == pytest.approx(expected, abs=1e-10)
    assert summary_of(tmp_path)["processes"] == 2


# ---------------------------------------------------------------------------------------------
# Config errors: unknown, colliding or unusable keys are one sentence, exit 2

@pytest.mark.parametrize(
    "args,expected",
    [
        (["+model.param_dtype=float32"], "Config error: model.param_dtype is set by the runner from the dtype group"),
        (["optimizer=adam", "+optimizer.mu_dtype=foo"], "Config error: optimizer cannot be built from its keys"),
    ],
)
def test_colliding_or_unusable_keys_are_config_errors(tmp_path, args, expected):
    line = one_error_line(run_cli([*args, f"hydra.run.dir={tmp_path}"], REPO))
    assert line.startswith(expected), line


# ---------------------------------------------------------------------------------------------
# Stop signals, failure reasons, health warnings, sweeps with a bad point, run directories and the
# start-up header (APP-B)

import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

from runner.parallel import distributed

# Far more steps than the signal lets run (each takes milliseconds): on a loaded machine 60 steps
# could all finish before the test's poller sends its signal.
STOP_STEPS = 2000
STOP = ["hilbert.L=12", "sampler.n_samples=512", "sampler.n_chains=8", "final_rounds=1", f"n_iter={STOP_STEPS}",
        "checkpoint_every=50", "exact=false"]


def start_run(args, run_dir, cwd=REPO):
    return subprocess.Popen([sys.executable, "-m", "runner", *args, f"hydra.run.dir={run_dir}"], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(proc, condition, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if condition():
            return True
        time.sleep(0.005)
    return False


def log_says(run_dir, text):
    return lambda: any(text in p.read_text() for p in run_dir.glob("*.log"))


def metrics_lines(run_dir, n):
    path = run_dir / "metrics.jsonl"
    return lambda: path.exists() and len(path.read_text().splitlines()) >= n


@pytest.mark.slow
def test_ctrl_c_checkpoints_at_the_next_step_and_exits_130(tmp_path):
    proc = start_run(STOP, tmp_path)
    assert wait_for(proc, metrics_lines(tmp_path, 12)), "the run ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    summary = summary_of(tmp_path)
    n_done = len(energies(tmp_path))
    assert summary["status"] == "interrupted" and 12 <= n_done < STOP_STEPS
    assert summary["reason"] == f"SIGINT received; stopped at step {n_done} after saving a checkpoint"
    with np.load(tmp_path / "checkpoint" / "state.npz") as data:  # no step lost since the last checkpoint
        assert json.loads(bytes(data["meta"]).decode())["step"] == n_done


def test_a_second_ctrl_c_aborts_at_once(tmp_path):
    # steps of about a second each, so the second Ctrl-C lands within the step the first one waits
    # for, however fast the compilation (a warm compilation cache makes it milliseconds)
    proc = start_run([*STOP, "sampler.sweep_size=2400"], tmp_path)
    assert wait_for(proc, log_says(tmp_path, "run directory:"))
    proc.send_signal(signal.SIGINT)
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "Interrupted again" in stderr
    assert not (tmp_path / "summary.json").exists()


def test_sigterm_before_the_first_step_writes_a_preempted_summary(tmp_path):
    """The issue's `timeout -s TERM 5` during the exact diagonalisation or compilation: exit 3, not 143."""
    proc = start_run([*STOP, "exact=true"], tmp_path)
    assert wait_for(proc, log_says(tmp_path, "run directory:"))
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 3, stderr
    summary = summary_of(tmp_path)
    assert summary["status"] == "preempted" and summary["steps_done"] == 0
    assert summary["reason"] == "SIGTERM received before the first step"
    assert not (tmp_path / "checkpoint").exists()  # none existed; none is made up


def test_an_exception_is_the_failure_reason(tmp_path):
    from runner import app

    app._write_failure(tmp_path, RuntimeError("boom\nsecond line"))
    assert summary_of(tmp_path)["status"] == "failed" and summary_of(tmp_path)["reason"] == "RuntimeError: boom"


def nan_run(tmp_path, caplog, overrides):
    from runner import app
    from runner.config.build import build
    from runner.parallel import mesh
    from tests.helpers.config import compose_config

    experiment = build(compose_config(overrides))
    with caplog.at_level("INFO", logger="runner"), pytest.raises(RunFailed) as failed:
        app.execute(experiment, mesh.make_mesh("single"), tmp_path)
    assert failed.value.summary == summary_of(tmp_path)  # what it wrote is what it raised
    return 1, caplog.text


def test_nan_failure_gives_its_reason_and_says_no_checkpoint_exists(tmp_path, caplog):
    code, text = nan_run(tmp_path, caplog, [*RUN, "n_iter=20", "optimizer.learning_rate=1e6"])
    summary = summary_of(tmp_path)
    n_done = len(energies(tmp_path))
    assert code == 1 and summary["status"] == "failed"
    assert summary["reason"] == f"energy is nan at step {n_done - 1}"
    assert "no checkpoint was written" in text and "last good checkpoint" not in text
    assert not (tmp_path / "checkpoint").exists()


def test_health_warnings_are_in_the_summary_and_printed(tmp_path, caplog):
    from runner import app
    from runner.config.build import build
    from runner.parallel import mesh
    from tests.helpers.config import compose_config

    # two steps from random parameters: far from the exact energy; CG allowed 2 iterations a step
    experiment = build(compose_config([*RUN, "n_iter=2", "exact=true", "preconditioner.solver=cg",
                                       "preconditioner.cg_maxiter=2"]))
    with caplog.at_level("INFO", logger="runner"):
        summary = app.execute(experiment, mesh.make_mesh("single"), tmp_path)
    assert summary["relative_error"] > 0.1
    names = [w["name"] for w in summary["warnings"]]
    assert "relative_error" in names and "cg_maxiter" in names, summary["warnings"]
    assert summary_of(tmp_path)["warnings"] == summary["warnings"]
    assert "health warning [relative_error]" in caplog.text and "health warning [cg_maxiter]" in caplog.text


@pytest.mark.slow
def test_sweep_records_a_bad_point_as_failed_and_runs_the_rest(tmp_path):
    proc = run_cli(["-m", *RUN, "n_iter=2", "sampler.n_chains=16", "sampler.n_samples=1000,256",
                    f"hydra.sweep.dir={tmp_path}"], REPO)
    assert proc.returncode == 2, proc.stderr  # the sweep ran on, and still says a point was bad
    bad, good = sorted(tmp_path.glob("*_*"))
    assert summary_of(bad) == {
        "status": "failed",
        "reason": "config error: sampler.n_samples must be a multiple of sampler.n_chains=16 (got 1000); try 992.",
        "error": "ConfigError: sampler.n_samples must be a multiple of sampler.n_chains=16 (got 1000); try 992.",
    }
    assert summary_of(good)["status"] == "completed"
    # the start-up header, before any heavy work
    log = next(good.glob("*.log")).read_text()
    for line in (f"run directory: {good.resolve()}", "lattice: chain(L=8", "8 sites, 8 bonds", "model: RBM(",
                 "80 parameters", "sampler: metropolis_local(", "256 samples over 16 chains",
                 "dtype: float64; backend: single, 1 process(es), 1 device(s)"):
        assert line in log, line
    assert log.index("run directory:") < log.index("lattice:") < log.index("status: completed")


@pytest.mark.slow
def test_config_error_removes_only_the_run_directory_it_created(tmp_path):
    proc = run_cli(["sampler.n_samples=1000"], tmp_path)
    assert proc.returncode == 2
    assert not (tmp_path / "outputs").exists()  # outputs/DATE/TIME, and its new parents, are gone
    proc = run_cli(["sampler.n_samples=1000", "hydra.run.dir=new/run"], tmp_path)
    assert proc.returncode == 2 and not (tmp_path / "new").exists()

    resumed = tmp_path / "resumed"
    (resumed / ".hydra").mkdir(parents=True)
    (resumed / "metrics.jsonl").write_text('{"step": 0}\n')
    empty = tmp_path / "empty"  # a directory that existed before, even an empty one, stays
    empty.mkdir()
    for run_dir in (resumed, empty):
        assert run_cli(["sampler.n_samples=1000", f"hydra.run.dir={run_dir}"], tmp_path).returncode == 2
        assert (run_dir / ".hydra").is_dir()
    assert (resumed / "metrics.jsonl").read_text() == '{"step": 0}\n'


def test_new_dirs_are_the_missing_run_directory_and_parents(tmp_path):
    from runner.cli import new_dirs

    (tmp_path / "outputs").mkdir()
    (tmp_path / "mine").mkdir()
    got = new_dirs(["n_iter=3", "hydra.run.dir=mine/a/b"], "2026-01-01/10-00-00", cwd=tmp_path)
    assert got == {tmp_path / "outputs" / "2026-01-01" / "10-00-00", tmp_path / "outputs" / "2026-01-01",
                   tmp_path / "mine" / "a" / "b", tmp_path / "mine" / "a"}


def test_header_shortens_long_config_values():
    from runner.outputs.header import describe

    edges = [[i, i + 1] for i in range(30)]
    assert describe({"_target_": "runner.physics.hilbert.graph", "n_sites": 31, "edges": edges, "positions": None}) == \
        "graph(n_sites=31, edges=[30 items])"


def test_header_says_which_evaluation_paths_the_model_takes():
    """The run says whether the model's declared fast paths or the generic ones are used."""
    from models import MLP, RBM
    from runner.outputs.header import paths

    assert paths(RBM(alpha=1)) == "the model's fast paths: local ratios, Metropolis cache, Jacobian products"
    assert paths(MLP(hidden=(4,))).startswith("generic paths")


def test_header_logs_the_models_sector_with_auto_resolved(caplog):
    import types

    from runner.config.build import build
    from runner.outputs.header import log_header
    from tests.helpers.config import KAGOME, compose_config

    layout = types.SimpleNamespace(n_devices=1)
    for exact, line in (("auto", "sector: k=(0,0) B1 P=+1 (auto: from the exact spectrum)"),
                        ("false", "sector: k=(0,0) A1 (auto: the trivial sector, the exact solver being off)")):
        config = compose_config([*KAGOME, "model.sector=auto", f"exact={exact}"])
        caplog.clear()
        with caplog.at_level("INFO"):
            log_header(build(config), layout, config)
        assert line in caplog.text
    config = compose_config(KAGOME)
    caplog.clear()
    with caplog.at_level("INFO"):
        log_header(build(config), layout, config)
    assert "model: CNN(" in caplog.text and "sector:" not in caplog.text and "task:" not in caplog.text


def test_header_names_a_task_other_than_the_ground_state(caplog):
    import types

    from runner.config.build import build
    from runner.outputs.header import log_header
    from tests.helpers.config import compose_config

    config = compose_config(["task=excited", "task.n_states=3", "hilbert.L=4", "dtype=complex128"])
    with caplog.at_level("INFO"):
        log_header(build(config), types.SimpleNamespace(n_devices=1), config)
    assert "task: excited(n_states=3)" in caplog.text


def test_header_says_what_a_full_sum_beyond_its_reach_samples_with(caplog):
    import types

    from runner.config.build import build
    from runner.outputs.header import log_header
    from tests.helpers.config import compose_config

    for torus, line in (([], "exact sum over"),
                        (["hilbert.L=6", "~monte_carlo"],  # the recipe's own sampler there, not its Monte Carlo set-up
                         "1024 samples over 16 chains, beyond the full sum's reach: metropolis_exchange")):
        config = compose_config(["experiment=triangular_heisenberg", *torus])
        caplog.clear()
        with caplog.at_level("INFO"):
            log_header(build(config), types.SimpleNamespace(n_devices=1), config)
        assert line in caplog.text and ("beyond the full sum's reach" in caplog.text) == bool(torus)


def test_resume_false_says_what_it_replaces(finished, tmp_path):
    """The line resume=false logs over a completed run, from the stored summary's fingerprint."""
    import dataclasses

    from runner.lifecycle import rundir

    stored = summary_of(finished)["config_fingerprint"]["config"]
    other = dataclasses.make_dataclass("S", ["resume", "fingerprint"])
    changed = other(False, {**stored, "hamiltonian.h": 2.0})
    assert rundir.replacing(finished, changed) == (
        f"resume=false: replacing the completed run in {finished} (hamiltonian.h was 1.0, now 2.0)")
    assert rundir.replacing(finished, other(False, stored)) == (
        f"resume=false: rerunning the completed run in {finished} with the same config")
    assert rundir.replacing(finished, other(True, stored)) is None
    assert rundir.replacing(tmp_path, other(False, stored)) is None


@pytest.mark.slow
def test_a_run_with_observables_reports_those_of_the_exact_ground_state(tmp_path):
    from runner.physics import exact, hamiltonians, observables
    from runner.physics import hilbert as hb

    run_cli(["hilbert.L=6", "n_iter=2", "sampler.n_samples=64", "sampler.n_chains=8", "final_rounds=1", "exact=true",
             "observables=spin", f"hydra.run.dir={tmp_path}"], REPO, check=True)
    summary = summary_of(tmp_path)
    correlations = json.loads((tmp_path / "correlations.json").read_text())
    assert set(summary["exact_observables"]) == set(summary["observables"])
    assert len(correlations["exact_structure_factor"]) == len(correlations["momenta"])
    lattice = hb.chain(6)
    ham = hamiltonians.ising(lattice, 1.0, 1.0)
    expected = observables.exact_values(observables.spin(lattice, ham), lattice, exact.ground_state(ham, lattice)[1])
    assert summary["exact_observables"] == pytest.approx(expected[0]["exact_observables"], abs=1e-10)
    assert np.asarray(correlations["exact_zz"]) == pytest.approx(np.asarray(expected[1]["exact_zz"]), abs=1e-10)


@pytest.mark.slow
def test_a_collapsed_run_stops_early_with_the_reason(tmp_path):
    """README's kagome example with a Metropolis exchange sampler: its chains freeze apart from
    about step 20 (it used to step on to a NaN energy at step 104)."""
    from runner.diagnostics import collapse

    proc = run_cli(["hilbert=kagome", "hilbert.L=2", "hamiltonian=heisenberg", "hilbert.total_sz=0",
                    "sampler=metropolis_exchange", "exact=false", f"hydra.run.dir={tmp_path}"], REPO)
    assert proc.returncode == 1
    summary = summary_of(tmp_path)
    assert summary["status"] == "failed" and summary["reason"].startswith("collapsed:"), summary["reason"]
    assert collapse.COLLAPSE_STEPS <= summary["steps_done"] < 60 and summary["energy"] is None
    assert sum("collapsed:" in line and "stopping" in line for line in (proc.stdout + proc.stderr).splitlines()) == 1


@pytest.mark.slow
def test_an_ordered_run_whose_acceptance_is_low_is_not_stopped(tmp_path):
    """The TFIM chain deep in its ordered phase: acceptance about 0.01 from step 35 on, but its
    chains agree (R-hat about 1): a sharply peaked healthy state runs to the end."""
    run_cli(["hilbert.L=10", "hamiltonian.h=0.3", "n_iter=70", "exact=false", f"hydra.run.dir={tmp_path}"], REPO,
            check=True)
    summary = summary_of(tmp_path)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert summary["status"] == "completed" and summary["steps_done"] == 70
    assert all(r["acceptance"] < 0.02 for r in records[-20:])  # the acceptance criterion alone would stop it
