"""The sweep cache: a value is returned only for the config it was stored with."""

from runner.lifecycle import sweep_cache


def test_value_round_trips_for_its_own_config_only(tmp_path):
    key = {"hilbert.L": 8, "hamiltonian.h": 1.0}
    assert sweep_cache.read(tmp_path / "cache", key) is None
    path = sweep_cache.write(tmp_path / "cache", key, -10.25)
    assert sweep_cache.read(tmp_path / "cache", key) == -10.25
    assert sweep_cache.read(tmp_path / "cache", {"hilbert.L": 8, "hamiltonian.h": 1}) == -10.25  # same numbers
    assert sweep_cache.read(tmp_path / "cache", {"hilbert.L": 8, "hamiltonian.h": 2.0}) is None
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [path.name]  # no temporary leftovers


def test_a_file_for_another_config_under_the_same_name_is_ignored(tmp_path):
    key = {"hamiltonian.h": 1.0}
    path = sweep_cache.write(tmp_path, {"hamiltonian.h": 3.0}, -1.0)
    path.rename(sweep_cache.path(tmp_path, key))  # as if two configs shared a hash
    assert sweep_cache.read(tmp_path, key) is None
    sweep_cache.path(tmp_path, key).write_text('{"value": -1.0, "config"')  # cut short
    assert sweep_cache.read(tmp_path, key) is None
