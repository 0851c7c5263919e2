"""runner.lifecycle.finish: the exact ground state's energy and observables, shared by a sweep's points."""

from runner.config.build import build
from runner.lifecycle import finish
from runner.physics import exact
from tests.config.test_build import compose_config


def test_a_sweep_computes_the_exact_observables_once_and_reads_them_back(tmp_path, monkeypatch):
    calls = []

    def counted(*args, **kwargs):
        calls.append(kwargs)
        return exact.ground_state(*args, **kwargs)

    monkeypatch.setattr(finish, "ground_state", counted)
    with_obs = build(compose_config(["hilbert.L=6", "exact=true", "observables=spin"]))
    first = finish.exact_ground(with_obs, tmp_path)
    again = finish.exact_ground(with_obs, tmp_path)
    assert calls == [{"vector": True}] and again == first  # read back from SWEEP_DIR/.exact_cache
    assert set(first.observed[0]["exact_observables"]) == set(with_obs.observables.all_names)
    assert len(first.observed[1]["exact_structure_factor"]) == 6

    plain = build(compose_config(["hilbert.L=6", "exact=true"]))  # no observables: the energy alone, no vector
    assert finish.exact_ground(plain, tmp_path) == finish.Exact(first.energy, None)
    assert calls[-1] == {"vector": False}
    assert finish.exact_ground(plain, tmp_path).energy == first.energy and len(calls) == 2
    assert finish.exact_ground(build(compose_config(["hilbert.L=6", "exact=false"])), tmp_path) == finish.Exact()
