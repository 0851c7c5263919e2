"""runner.lifecycle.hparams_search: the trial objective, a failed trial as a bad value, an Optuna study that is
killed and resumed from its SQLite store, and the search composed with the SLURM launcher."""

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from runner.errors import ConfigError, RunFailed, RunStopped
from runner.lifecycle import hparams_search
from tests.helpers.cli import REPO

TINY = ["hilbert.L=6", "sampler.n_samples=128", "n_iter=10", "final_rounds=1", "exact=false"]
DIVERGING = {"optimizer.learning_rate": 50.0, "preconditioner.diag_shift": 1e-4}  # NaN within 10 steps


def test_objective_is_the_metric_of_a_completed_run_else_the_penalty():
    done = {"status": "completed", "energy": -7.5, "v_score": 0.03, "relative_error": None}
    assert hparams_search.objective(done, "energy") == -7.5
    assert hparams_search.objective(done, "v_score") == 0.03
    assert hparams_search.objective(done, "relative_error") == hparams_search.PENALTY  # not computed
    assert hparams_search.objective({**done, "status": "failed"}, "energy") == hparams_search.PENALTY
    assert hparams_search.objective({**done, "energy": math.nan}, "energy") == hparams_search.PENALTY
    assert hparams_search.objective(None, "energy", "maximize") == -hparams_search.PENALTY
    assert math.isfinite(hparams_search.PENALTY)


def test_optimized_metric_is_checked():
    assert hparams_search.check({"optimized_metric": "v_score"}) == "v_score"
    with pytest.raises(ConfigError, match="optimized_metric must be one of energy, v_score"):
        hparams_search.check({"optimized_metric": "acceptance"})


def test_run_trial_turns_failures_into_bad_values_but_lets_stops_through(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"status": "failed", "energy": None}))

    def raises(error):
        def fn():
            raise error
        return fn

    assert hparams_search.run_trial(lambda: {"status": "completed", "energy": -3.0}, tmp_path, "energy") == -3.0
    failed = RunFailed({"status": "failed", "reason": "energy is nan at step 3"})
    assert hparams_search.run_trial(raises(failed), tmp_path, "energy") == hparams_search.PENALTY
    bad = ConfigError("model.alpha", "must be at least 1 (got 0)")
    assert hparams_search.run_trial(raises(bad), tmp_path / "missing", "energy") == hparams_search.PENALTY
    assert hparams_search.run_trial(raises(RuntimeError("boom")), tmp_path, "energy") == hparams_search.PENALTY
    with pytest.raises(RunStopped):  # preempted: the study stops and is resumed later
        hparams_search.run_trial(raises(RunStopped({"status": "preempted"})), tmp_path, "energy")


def test_sqlite_storage_creates_its_folder(tmp_path):
    url = hparams_search.sqlite_storage(str(tmp_path / "sweep" / "optuna.db"))
    assert url == f"sqlite:///{tmp_path}/sweep/optuna.db" and (tmp_path / "sweep").is_dir()


def compose(overrides):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("vmc_run_id"):
        OmegaConf.register_new_resolver("vmc_run_id", lambda: "test", use_cache=True)
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return hydra_compose("config", overrides=overrides, return_hydra_config=True)


def test_the_search_composes_with_the_slurm_launcher(tmp_path):
    from hydra.utils import instantiate
    from optuna.samplers import TPESampler

    cfg = compose(["hparams_search=lr_diag_shift", "hydra/launcher=slurm", f"hydra.sweep.dir={tmp_path}/s",
                   "hydra.sweeper.n_jobs=2"])
    sweeper, launcher = cfg.hydra.sweeper, cfg.hydra.launcher
    assert sweeper._target_ == "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"
    assert launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert dict(sweeper.params) == {"optimizer.learning_rate": "tag(log, interval(0.001, 0.2))",
                                    "preconditioner.diag_shift": "tag(log, interval(0.0001, 0.1))"}
    assert (sweeper.direction, sweeper.study_name, cfg.optimized_metric) == ("minimize", "lr_diag_shift", "energy")
    plugin = instantiate(sweeper)  # what Hydra builds: the TPE sampler and the study's store
    assert isinstance(plugin.sweeper.sampler, TPESampler)
    assert plugin.sweeper.storage == f"sqlite:///{tmp_path}/s/optuna.db"
    assert instantiate(launcher).__class__.__name__ == "SlurmLauncher"
    assert launcher.submitit_folder == f"{tmp_path}/s/.submitit/%j"


def sweep_args(sweep_dir, n_trials, *extra):
    return [sys.executable, "-m", "runner", "-m", "hparams_search=lr_diag_shift", f"hydra.sweep.dir={sweep_dir}",
            f"hydra.sweeper.n_trials={n_trials}", "hydra.sweeper.sampler.n_startup_trials=3",
            # the range reaches the diverging learning rate; an enqueued trial takes it first
            "optimizer.learning_rate=tag(log, interval(0.001, 50.0))", *TINY, *extra]


def load_study(sweep_dir):
    import optuna

    return optuna.load_study(study_name="lr_diag_shift", storage=f"sqlite:///{sweep_dir}/optuna.db")


def n_complete(sweep_dir):
    import optuna

    return sum(t.state == optuna.trial.TrialState.COMPLETE for t in load_study(sweep_dir).trials)


def run_of(sweep_dir, params):
    """The finished trial's run directory: the one whose overrides hold its parameter values and
    that has a summary (a resumed TPE may retry the point of the trial that was killed)."""
    for run in sweep_dir.glob("*/.hydra/overrides.yaml"):
        values = dict(o.split("=", 1) for o in yaml.safe_load(run.read_text()))
        if (all(math.isclose(float(values[k]), v, rel_tol=1e-12) for k, v in params.items())
                and (run.parent.parent / "summary.json").is_file()):
            return run.parent.parent
    raise AssertionError(f"no finished run for {params}")


@pytest.mark.slow
def test_a_killed_study_resumes_from_its_store_and_a_diverged_trial_is_bad(tmp_path):
    import optuna

    sweep_dir = tmp_path / "study"
    sweep_dir.mkdir()
    study = optuna.create_study(study_name="lr_diag_shift", storage=f"sqlite:///{sweep_dir}/optuna.db")
    study.enqueue_trial(DIVERGING)
    env = {**os.environ, "HYDRA_FULL_ERROR": "1"}
    proc = subprocess.Popen(sweep_args(sweep_dir, 6), cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, env=env)
    try:
        deadline = time.monotonic() + 400
        while n_complete(sweep_dir) < 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(1.0)
        assert proc.poll() is None, proc.communicate()[0][-4000:]
        assert n_complete(sweep_dir) >= 3, "three trials did not finish in time"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # as a node failure would: no clean-up at all
        proc.communicate()
    killed = load_study(sweep_dir).trials
    n_done = sum(t.state == optuna.trial.TrialState.COMPLETE for t in killed)
    assert 3 <= n_done < 6

    resumed = subprocess.run(sweep_args(sweep_dir, 6 - n_done), cwd=tmp_path, capture_output=True, text=True,
                             timeout=600, env=env)
    assert resumed.returncode == 0, resumed.stdout[-4000:] + resumed.stderr[-4000:]
    trials = load_study(sweep_dir).trials
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    before = {t.number: t.value for t in killed if t.state == optuna.trial.TrialState.COMPLETE}
    assert len(complete) == 6 and {t.number: t.value for t in complete if t.number in before} == before
    assert len(trials) - len(complete) <= 1  # at most the trial that was running when killed
    diverged = complete[0]
    assert diverged.params == DIVERGING and diverged.value == hparams_search.PENALTY
    assert json.loads((run_of(sweep_dir, DIVERGING) / "summary.json").read_text())["status"] == "failed"
    for trial in complete[1:]:
        summary = json.loads((run_of(sweep_dir, trial.params) / "summary.json").read_text())
        expected = summary["energy"] if summary["status"] == "completed" else hparams_search.PENALTY
        assert trial.value == expected
    best = load_study(sweep_dir).best_trial
    assert best.number != diverged.number and -8.0 < best.value < 0.0  # the L=6 chain's exact energy is -7.727
    assert "Best value" in resumed.stdout + resumed.stderr


@pytest.mark.slow
def test_trials_return_their_objective_through_submitit(tmp_path):
    """Two trials at once as submitit jobs (the SLURM launcher's code path, run locally): each job's
    value comes back through submitit's pickles into the study."""
    import optuna

    sweep_dir = tmp_path / "study"
    proc = subprocess.run([*sweep_args(sweep_dir, 2), "hydra/launcher=local_tasks", "hydra.launcher.tasks_per_node=1",
                           "hydra.sweeper.n_jobs=2", "optimized_metric=v_score"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    trials = load_study(sweep_dir).trials
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 2
    for trial in trials:
        summary = json.loads((run_of(sweep_dir, trial.params) / "summary.json").read_text())
        expected = summary["v_score"] if summary["status"] == "completed" else hparams_search.PENALTY
        assert trial.value == expected


@pytest.mark.slow
@pytest.mark.slurm
def test_trials_run_as_concurrent_slurm_jobs(tmp_path):
    """The search on the local SLURM (`make slurm-up`): two trials as two SLURM jobs at once, their
    values in the study; skipped without SLURM like tests/integration/test_slurm.py."""
    from tests.helpers.slurm import slurm_unavailable

    if slurm_unavailable() is not None:
        pytest.skip(slurm_unavailable())
    import uuid

    import optuna

    sweep_dir, name = tmp_path / "study", f"vmc-test-{uuid.uuid4().hex[:8]}"
    try:
        proc = subprocess.run([*sweep_args(sweep_dir, 2), "hydra/launcher=slurm", f"hydra.launcher.name={name}",
                               "hydra.sweeper.n_jobs=2"], cwd=tmp_path, capture_output=True, text=True, timeout=240)
    finally:
        subprocess.run(["scancel", "-n", name], capture_output=True, timeout=20)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    trials = load_study(sweep_dir).trials
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 2
    for trial in trials:
        summary = json.loads((run_of(sweep_dir, trial.params) / "summary.json").read_text())
        expected = summary["energy"] if summary["status"] == "completed" else hparams_search.PENALTY
        assert trial.value == expected


def test_the_store_set_up_logs_nothing_but_warnings(tmp_path):
    """alembic's set-up lines (logged on importing optuna) and optuna's "A new study created in
    RDB" are silenced where the CLI starts and the store is made; a real warning still shows (in a
    subprocess: optuna must not be imported yet)."""
    script = ("import logging, sys\n"
              "logging.basicConfig(level=logging.INFO, stream=sys.stderr)\n"
              "from runner.lifecycle import hparams_search\n"
              "hparams_search.quiet_storage_logs()  # runner.cli.main, before Hydra\n"
              "import optuna\n"
              f"url = hparams_search.sqlite_storage({str(tmp_path / 's' / 'optuna.db')!r})\n"
              "optuna.create_study(study_name='quiet', storage=url)\n"
              "logging.getLogger('alembic.runtime.migration').warning('a real warning')\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().splitlines() == ["WARNING:alembic.runtime.migration:a real warning"], proc.stderr
