"""runner.lifecycle.load: a run directory read back, including one written before runner/ was split by
concern (the 6dc7890 fixture: its `_target_`s name the old module paths)."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from runner.config import fingerprint
from runner.errors import ConfigError
from runner.lifecycle import load

OLD_RUN = Path(__file__).resolve().parents[1] / "integration" / "golden" / "run_6dc7890" / "run"
# A time evolution written when the integrator and the TDVP were flat task keys (task.dt, task.integrator: rk4).
OLD_DYNAMICS = OLD_RUN.parents[1] / "run_bcc302d_dynamics" / "run"


def test_reads_config_overrides_and_fingerprint_of_an_old_run():
    config = load.read_config(OLD_RUN)
    assert config["hamiltonian"]["_target_"] == "runner.operators.ising"  # written by the old layout
    assert load.read_overrides(OLD_RUN) == ["n_iter=10", "checkpoint_every=5", "hilbert.L=8", "observables=spin"]
    record = load.stored_fingerprint(OLD_RUN)
    assert record["config"]["hilbert.L"] == 8
    # the stored fingerprint names old module paths; today's fingerprint of the same config agrees with it
    today = fingerprint.of(fingerprint.fingerprinted(config, None))
    assert fingerprint.first_difference(record["config"], today) is None
    assert fingerprint.same(record, today)


def test_loads_the_checkpoint_of_an_old_run_into_its_config():
    trained = load.load(OLD_RUN)
    assert trained.meta["step"] == 10
    assert trained.experiment.hilbert.n_sites == 8
    assert type(trained.experiment.hamiltonian).__name__ == "PauliSum"
    leaves = [np.asarray(x) for x in __import__("jax").tree_util.tree_leaves(trained.state.params)]
    assert leaves and all(np.all(np.isfinite(x)) for x in leaves)


def test_a_dynamics_run_of_the_flat_task_keys_reads_and_loads_in_todays_spelling():
    config = load.read_config(OLD_DYNAMICS)
    assert config["task"]["integrator"] == {"_target_": "runner.core.integrators.rk4", "dt": 0.01}
    assert config["task"]["equation"]["real_time"] is True and "propagation" not in config["task"]
    assert "task.integrator.dt=0.01" in load.read_overrides(OLD_DYNAMICS)
    today = fingerprint.of(fingerprint.fingerprinted(config, None))
    assert fingerprint.same(load.stored_fingerprint(OLD_DYNAMICS), today)
    trained = load.load(OLD_DYNAMICS)
    assert trained.meta["t"] == 0.04 and trained.experiment.settings.task.integrator.dt == 0.01
    leaves = [np.asarray(x) for x in __import__("jax").tree_util.tree_leaves(trained.state.params)]
    assert leaves and all(np.all(np.isfinite(x)) for x in leaves)


def test_refuses_a_directory_without_config_or_checkpoint(tmp_path):
    with pytest.raises(ConfigError, match="not a run directory"):
        load.read_config(tmp_path)
    run = tmp_path / "run"
    shutil.copytree(OLD_RUN, run)
    shutil.rmtree(run / "checkpoint")
    with pytest.raises(ConfigError, match="holds no checkpoint"):
        load.load(run)


def test_refuse_difference_names_the_key_and_both_values():
    with pytest.raises(ConfigError, match=r"model.alpha is 2 in this config but 1 in the run X; why"):
        load.refuse_difference({"model.alpha": 1, "seed": 0}, {"model.alpha": 2, "seed": 5}, ("model.",), "the run X", "why")
    load.refuse_difference({"model.alpha": 1, "seed": 0}, {"model.alpha": 1, "seed": 5}, ("model.",), "X", "why")


def test_an_old_summary_is_read_as_it_was_written():
    summary = json.loads((OLD_RUN / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["n_iter"] == 10


def test_retired_keys_are_dropped_at_their_neutral_value_and_refused_otherwise(tmp_path):
    assert "peak_restart_every" not in load.read_config(OLD_RUN)
    run = tmp_path / "run"
    shutil.copytree(OLD_RUN, run)
    path = run / ".hydra" / "config.yaml"
    path.write_text(path.read_text().replace("peak_restart_every: 0", "peak_restart_every: 5"))
    with pytest.raises(ConfigError, match="peak_restart_every is 5 in that run"):
        load.read_config(run)


def _as_before_model_sector(run_dir, symmetries="none"):
    """Rewrites a lattice-model run as the code before model.sector wrote it: model.symmetries,
    parity and momentum in its config and its fingerprints, no model.sector."""
    import yaml

    path = run_dir / ".hydra" / "config.yaml"
    config = yaml.safe_load(path.read_text())
    del config["model"]["sector"]
    config["model"].update(symmetries=symmetries, parity=None)
    path.write_text(yaml.safe_dump(config, sort_keys=False))

    def old(record):
        flat = {k: v for k, v in record["config"].items() if k != "model.sector"}
        flat.update({"model.symmetries": symmetries, "model.parity": None})
        return fingerprint.record(flat)

    npz = run_dir / "checkpoint" / "state.npz"
    with np.load(npz) as data:
        arrays = dict(data)
    meta = json.loads(bytes(arrays["meta"]).decode())
    meta["config_fingerprint"] = old(meta["config_fingerprint"])
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(npz, **arrays)
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["config_fingerprint"] = old(summary["config_fingerprint"])
    (run_dir / "summary.json").write_text(json.dumps(summary))


@pytest.mark.slow
def test_an_old_lattice_run_at_the_neutral_projection_keys_loads_skips_and_resumes(tmp_path):
    """A run written with model.symmetries none and parity null (today: model.sector null) loads,
    is returned as finished for the same n_iter, and resumes for more; one with a projection is
    refused in one sentence."""
    import runner

    overrides = ["model=rbm_symm", "hilbert.L=6", "sampler.n_samples=64", "sampler.n_chains=4", "final_rounds=1",
                 "exact=false", "peak_search=0"]
    run_dir = tmp_path / "run"
    runner.run([*overrides, "n_iter=2"], run_dir)
    _as_before_model_sector(run_dir)
    summary = (run_dir / "summary.json").read_bytes()
    assert "symmetries" not in load.read_config(run_dir)["model"]
    assert runner.load(run_dir).step == 2
    assert runner.run([*overrides, "n_iter=2"], run_dir).step == 2
    assert (run_dir / "summary.json").read_bytes() == summary  # returned as finished, not redone
    assert runner.run([*overrides, "n_iter=3"], run_dir).step == 3
    projected = tmp_path / "projected"
    shutil.copytree(run_dir, projected)
    _as_before_model_sector(projected, symmetries="lattice")
    with pytest.raises(ConfigError, match="model.symmetries is lattice in that run, an option this version no longer "
                                          "has .model.sector replaces"):
        runner.load(projected)
