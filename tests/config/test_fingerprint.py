"""The config fingerprint: which keys it covers, how it compares, the sentence it refuses with."""

import pytest

from runner.config import fingerprint
from runner.errors import ConfigError
from tests.helpers.cli import REPO, run_cli
from tests.helpers.config import compose_config


def test_fingerprint_covers_the_numbers_and_not_the_run_knobs():
    flat = fingerprint.of(compose_config())
    for key in ("seed", "chunk_size", "final_rounds", "hamiltonian.h", "hilbert.L", "model._target_",
                "optimizer.learning_rate", "preconditioner.diag_shift", "sampler.n_chains", "dtype.name"):
        assert key in flat, key
    assert not [k for k in flat if k.split(".")[0] in ("n_iter", "resume", "checkpoint_every", "exact", "parallel")]
    assert flat["hamiltonian.h"] == 1.0 and flat["model.alpha"] == 1


def test_layout_length_and_resume_knobs_leave_the_hash_unchanged():
    base = fingerprint.digest(fingerprint.of(compose_config()))
    same = ["n_iter=7", "resume=false", "checkpoint_every=3", "exact=false", "parallel=sharded",
            "parallel.cpu_devices=2"]
    assert fingerprint.digest(fingerprint.of(compose_config(same))) == base
    for change in (["hamiltonian.h=2"], ["seed=1"], ["optimizer.learning_rate=0.03"], ["model=mlp"],
                   ["dtype=complex128"], ["final_rounds=3"]):
        assert fingerprint.digest(fingerprint.of(compose_config(change))) != base, change


def test_numbers_compare_by_value():
    assert fingerprint.digest({"hamiltonian.h": 1}) == fingerprint.digest({"hamiltonian.h": 1.0})
    assert fingerprint.first_difference({"hamiltonian.h": 1}, {"hamiltonian.h": 1.0}) is None
    assert fingerprint.first_difference({"model.hidden": [16]}, {"model.hidden": [16.0]}) is None
    assert fingerprint.first_difference({"model.hidden": [16]}, {"model.hidden": [16, 8]}) is not None


def test_first_difference_is_in_config_order_and_sees_missing_keys():
    stored = {"hilbert.L": 8, "hamiltonian.h": 1.0, "seed": 0}
    current = {"hilbert.L": 8, "hamiltonian.h": 2.0, "seed": 1}
    assert fingerprint.first_difference(stored, current) == ("hamiltonian.h", 1.0, 2.0)
    assert fingerprint.first_difference(stored, current, ignore=("hamiltonian.h",)) == ("seed", 0, 1)
    key, old, new = fingerprint.first_difference({**stored, "model.alpha": 2}, stored)
    assert key == "model.alpha" and old == 2 and new is fingerprint.MISSING


def test_check_refuses_in_one_sentence_naming_key_and_both_values(tmp_path):
    stored = fingerprint.record({"hamiltonian.h": 1.0, "final_rounds": 8})
    fingerprint.check(stored, {"hamiltonian.h": 1, "final_rounds": 2}, tmp_path, ignore=("final_rounds",))
    with pytest.raises(ConfigError) as info:
        fingerprint.check(stored, {"hamiltonian.h": 2.0, "final_rounds": 8}, tmp_path)
    sentence = info.value.sentence()
    assert sentence == (f"hamiltonian.h is 2.0 in this config but 1.0 in the run stored in {tmp_path}; "
                        "use a new run directory or resume=false to start over.")
    with pytest.raises(ConfigError) as info:
        fingerprint.check(stored, {"hamiltonian.h": 1.0, "final_rounds": 2}, tmp_path)
    assert info.value.key == "final_rounds"


@pytest.mark.parametrize("stored", [None, {}, {"hash": "abc"}])
def test_a_run_without_fingerprint_is_refused(tmp_path, stored):
    with pytest.raises(ConfigError) as info:
        fingerprint.check(stored, {"seed": 0}, tmp_path)
    assert "before config fingerprints" in info.value.sentence() and "resume=false" in info.value.sentence()


def test_show_writes_values_as_overrides():
    assert [fingerprint.show(v) for v in (True, None, "models.RBM", 0.02, 3, [16, 8], fingerprint.MISSING)] == [
        "true", "null", "models.RBM", "0.02", "3", "[16,8]", "unset"]


def test_stamp_adds_hash_and_config():
    summary = fingerprint.stamp({"status": "completed"}, {"seed": 4})
    assert summary["config_fingerprint"] == {"hash": fingerprint.digest({"seed": 4}), "config": {"seed": 4}}


def test_resume_ignores_whole_groups_by_prefix(tmp_path):
    stored = fingerprint.record({"hamiltonian.h": 1.0, "observables._target_": "runner.physics.observables.none"})
    current = {"hamiltonian.h": 1.0, "observables._target_": "runner.physics.observables.spin", "observables.every": 5}
    fingerprint.check(stored, current, tmp_path, ignore=fingerprint.RESUME_IGNORES)
    with pytest.raises(ConfigError) as info:
        fingerprint.check(stored, current, tmp_path)
    assert info.value.key == "observables._target_"
    # a group name is not a prefix of a longer top-level key
    assert fingerprint.first_difference({"observables_x": 1}, {"observables_x": 2}, ignore=("observables",))


def test_a_key_added_later_is_no_difference_while_null():
    """A run stored before a key existed matches a config that sets the key to null (its
    behaviour before the key), not one that sets it to anything else."""
    stored = {"hilbert.L": 8, "seed": 0}
    assert fingerprint.first_difference(stored, {**stored, "clip_local_energy": None}) is None
    key, old, new = fingerprint.first_difference(stored, {**stored, "clip_local_energy": 5.0})
    assert key == "clip_local_energy" and old is fingerprint.MISSING and new == 5.0


def test_module_paths_do_not_count_but_the_constructor_does():
    old = {"hamiltonian._target_": "runner.operators.ising", "hamiltonian.h": 1.0}
    new = {"hamiltonian._target_": "runner.physics.hamiltonians.ising", "hamiltonian.h": 1.0}
    assert fingerprint.digest(old) == fingerprint.digest(new)
    assert fingerprint.first_difference(old, new) is None
    other = {**new, "hamiltonian._target_": "runner.physics.hamiltonians.xxz"}
    assert fingerprint.first_difference(old, other) == ("hamiltonian._target_", "ising", "xxz")
    assert fingerprint.of({"model": {"_target_": "models.RBM", "alpha": 1}}) == {"model._target_": "RBM", "model.alpha": 1}


def test_a_retired_key_counts_only_away_from_its_neutral_value():
    current = {"seed": 0}
    assert fingerprint.first_difference({"seed": 0, "peak_restart_every": 0}, current) is None
    assert fingerprint.same(fingerprint.record({"seed": 0, "peak_restart_every": 0}), current)
    assert fingerprint.first_difference({"seed": 0, "peak_restart_every": 3}, current)[0] == "peak_restart_every"


def test_the_retired_projection_keys_of_the_lattice_models():
    """model.symmetries, parity and momentum (now model.sector) of rbm_symm, cnn and vit: dropped at
    none / null / null, one sentence otherwise; a custom model's key of that name is its own."""
    old = {"model": {"_target_": "models.CNN", "channels": 8, "symmetries": "none", "parity": None, "momentum": None},
           "seed": 0}
    assert fingerprint.without_retired(old) == {"model": {"_target_": "models.CNN", "channels": 8}, "seed": 0}
    custom = {"model": {"_target_": "my_pkg.Model", "parity": 1}}
    assert fingerprint.without_retired(custom) == custom
    with pytest.raises(ConfigError) as info:
        fingerprint.without_retired({"model": {"_target_": "models.ViT", "symmetries": "translations",
                                               "parity": None, "momentum": [1, 0]}})
    assert info.value.sentence() == ("model.symmetries is translations in that run, an option this version no longer "
                                     "has (model.sector replaces model.symmetries, parity and momentum).")
    today = fingerprint.of({"model": {"_target_": "models.CNN", "channels": 8, "sector": None}, "seed": 0})
    stored = fingerprint.of(old)
    assert fingerprint.first_difference(stored, today) is None
    assert fingerprint.same(fingerprint.record(stored), today)
    assert fingerprint.first_difference({**stored, "model.parity": 1}, today)[0] == "model.parity"
    assert fingerprint.first_difference(stored, {**today, "model.sector": "auto"})[0] == "model.sector"
    assert not fingerprint.same(fingerprint.record(stored), {**today, "model.sector": "auto"})


def test_the_retired_activation_of_the_cnn():
    """model.activation of cnn (log_cosh, its one value, now always): dropped at log_cosh, one sentence
    otherwise; another model's key of that name is its own."""
    old = {"model": {"_target_": "models.CNN", "channels": 8, "activation": "log_cosh", "sector": None}, "seed": 0}
    today = {"model": {"_target_": "models.CNN", "channels": 8, "sector": None}, "seed": 0}
    assert fingerprint.without_retired(old) == today
    stored, current = fingerprint.of(old), fingerprint.of(today)
    assert fingerprint.first_difference(stored, current) is None
    assert fingerprint.same(fingerprint.record(stored), current)
    assert fingerprint.digest(stored) == fingerprint.digest(current)
    other = {**stored, "model.activation": "tanh"}
    assert fingerprint.first_difference(other, current) == ("model.activation", "tanh", fingerprint.MISSING)
    assert not fingerprint.same(fingerprint.record(other), current)
    with pytest.raises(ConfigError) as info:
        fingerprint.without_retired({"model": {**old["model"], "activation": "tanh"}, "seed": 0})
    assert info.value.sentence() == ("model.activation is tanh in that run, an option this version no longer has "
                                     "(the CNN's nonlinearity is log_cosh).")
    custom = {"model": {"_target_": "my_pkg.Model", "activation": "log_cosh"}}
    assert fingerprint.without_retired(custom) == custom
    assert fingerprint.first_difference(fingerprint.of(custom), {"model._target_": "Model"})[0] == "model.activation"


def test_a_removed_key_on_the_command_line_is_refused_in_one_sentence(tmp_path):
    proc = run_cli(["model=cnn", "model.activation=log_cosh", f"hydra.run.dir={tmp_path / 'run'}"], REPO, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("Config error: model.activation is not a key of model=cnn; "), proc.stderr
    assert not (tmp_path / "run").exists()


def test_a_task_of_the_flat_spelling_compares_as_todays():
    """A dynamics run written when the integrator and the TDVP were flat task keys (integrator: rk4, dt,
    atol, propagation, ...): its stored fingerprint compares equal to today's nested one (`UPGRADES`),
    and a changed value still counts."""
    old = {"task": {"name": "dynamics", "t_end": 0.04, "dt": 0.01, "integrator": "rk4", "atol": 1e-6, "rtol": 1e-6,
                    "dt_min": 1e-6, "dt_max": 0.1, "save_every": 0.02, "measure_rounds": None, "propagation": "real",
                    "diag_shift": 0.0, "rcond": 1e-8, "snr_cutoff": None, "initial_state": "plus_x"}, "seed": 0}
    today = compose_config(["task=dynamics", "task.t_end=0.04", "task.save_every=0.02"])
    current = fingerprint.of({"task": today["task"], "seed": 0})
    stored = fingerprint.of(old)
    assert "task.dt" in stored and "task.integrator.dt" in current
    assert fingerprint.first_difference(stored, current) is None
    assert fingerprint.same(fingerprint.record(stored), current)
    assert fingerprint.digest(stored) == fingerprint.digest(current)
    assert fingerprint.upgraded(old)["task"] == {**today["task"]}
    assert fingerprint.first_difference({**stored, "task.dt": 0.02}, current)[0] == "task.integrator.dt"
    assert fingerprint.first_difference({**stored, "task.propagation": "imaginary"}, current)[0] == "task.equation.real_time"
    assert fingerprint.first_difference({**stored, "task.integrator": "rk45"}, current)[0] == "task.integrator._target_"


def test_a_stored_runs_overrides_without_its_retired_keys():
    """.hydra/overrides.yaml of a run from before a key was retired (model.activation of the CNN) or renamed."""
    cnn = {"model": {"_target_": "models.CNN", "channels": 8, "activation": "log_cosh"}}
    lines = ["model=cnn", "model.activation=log_cosh", "task.dt=0.02", "seed=1"]
    assert fingerprint.without_retired_overrides(lines, cnn) == ["model=cnn", "task.integrator.dt=0.02", "seed=1"]
    custom = {"model": {"_target_": "my_pkg.Model", "activation": "tanh"}}
    assert fingerprint.without_retired_overrides(["model.activation=tanh"], custom) == ["model.activation=tanh"]
