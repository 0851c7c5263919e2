"""runner.lifecycle.finish: the exact ground state's energy and observables, shared by a sweep's points; the
final estimate runs its rounds on the training step's compiled sampling, compiling no sampler of its own, and
gives the numbers of the estimate in one program."""

import jax
import jax.numpy as jnp
import pytest

from runner.config.build import build
from runner.core import sampler
from runner.core.vmc import init_state
from runner.lifecycle import finish, ground_state
from runner.parallel import mesh
from runner.physics import exact
from tests.helpers.config import compose_config

SMALL = ["hilbert.L=6", "sampler.n_samples=64", "sampler.n_chains=8", "final_rounds=3", "exact=false"]


def _trained(overrides, backend):
    """(experiment, layout, shardings, compiled step, state after three steps)."""
    experiment = build(compose_config([*SMALL, *overrides]))
    layout = mesh.make_mesh(backend)
    state = init_state(experiment.problem, 0, jnp.ones((6,), jnp.int8))
    shardings = mesh.shard_state(state, layout)
    state = jax.device_put(state, shardings)
    step = ground_state.compile_step(experiment, state, shardings, layout)
    for _ in range(3):
        state, _ = step(state)
    return experiment, layout, shardings, step, state


@pytest.mark.parametrize("overrides, backend", [
    ([], "single"),
    (["observables=spin"], "single"),
    (["observables=spin"], "sharded"),
])
@pytest.mark.slow
def test_the_final_estimate_samples_with_the_training_steps_program(overrides, backend, monkeypatch):
    experiment, layout, shardings, step, state = _trained(overrides, backend)
    traced = []  # the Metropolis sampler is traced once for every program that samples
    metropolis = sampler._sample_metropolis
    monkeypatch.setattr(sampler, "_sample_metropolis", lambda *args: traced.append(1) or metropolis(*args))
    reused = finish.final_estimate(experiment, state, shardings, layout, 0, step.draw)
    assert traced == []
    one_program = finish.final_estimate(experiment, state, shardings, layout, 0)
    assert traced
    assert reused == one_program  # bit for bit, observables included
    assert reused[0]["log_abs_max"] is not None


def test_a_full_sum_step_stays_one_program():
    """A full sum's step keeps its reductions in one program (bit for bit on every layout:
    tests/core/test_full_sum.py); its estimate sums once and reuses nothing."""
    step = _trained(["sampler=full_sum"], "single")[3]
    assert step.draw is None


def test_a_reweighted_run_estimates_in_one_program(monkeypatch):
    """Trained on |psi|: the step's samples are not the estimate's (|psi|^2, after a burn-in), so
    the step is one program and the estimate another."""
    experiment, layout, shardings, step, state = _trained(["sampler.machine_pow=1"], "single")
    assert step.draw is None
    traced = []
    metropolis = sampler._sample_metropolis
    monkeypatch.setattr(sampler, "_sample_metropolis", lambda *args: traced.append(1) or metropolis(*args))
    final, _ = finish.final_estimate(experiment, state, shardings, layout, 16, step.draw)
    assert traced and final["energy"] is not None


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
