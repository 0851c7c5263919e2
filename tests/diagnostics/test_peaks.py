"""runner.diagnostics.peaks: the search for configurations with more |psi|^2 than every sample, what finding
one proves, and where runs and evaluations report it."""

import dataclasses
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from runner import app
from runner.config.build import build
from runner.core.vmc import init_state
from runner.diagnostics import health, peaks
from runner.parallel import mesh
from runner.physics.hilbert import all_states, chain
from tests.helpers import dense
from tests.helpers.config import compose_config


def _swaps(x):
    """Every configuration one exchange of two unequal spins (or one flip, `flips`) away."""
    out = set()
    for a in range(len(x)):
        for b in range(a + 1, len(x)):
            if x[a] != x[b]:
                y = x.copy()
                y[[a, b]] = y[[b, a]]
                out.add(y.tobytes())
    return out


def _flips(x):
    out = set()
    for a in range(len(x)):
        y = x.copy()
        y[a] = -y[a]
        out.add(y.tobytes())
    return out


@pytest.mark.parametrize("total_sz", [0, 1, None])
def test_the_moves_are_every_exchange_of_unequal_spins_and_without_fixed_sz_every_flip(total_sz):
    hilbert = chain(8, total_sz=total_sz)
    x_KxN = peaks.uniform_configurations(hilbert, 4, seed=3)
    if total_sz is not None:
        assert np.all(x_KxN.sum(axis=1) == 2 * total_sz)
    for x in x_KxN:
        nb_MxN = peaks._neighbours(x, *peaks._moves(hilbert))
        want = _swaps(x) | (_flips(x) if total_sz is None else set())
        assert len(nb_MxN) == len(want) and {nb.tobytes() for nb in nb_MxN} == want


@pytest.mark.parametrize("total_sz", [0, None])
def test_the_ascent_climbs_to_the_single_maximum_from_every_start(total_sz):
    hilbert = chain(24, total_sz=total_sz)
    target = peaks.uniform_configurations(hilbert, 1, seed=7)[0]
    log_abs = lambda s: np.asarray(s, float) @ target  # noqa: E731
    starts = peaks.uniform_configurations(hilbert, 6, seed=1)
    x_KxN, value_K, complete = peaks.ascend(log_abs, hilbert, starts)
    assert complete and np.all(x_KxN == target) and np.all(value_K == 24.0)
    # a budget too small for one step of every start: stopped, where it had got to
    x_KxN, value_K, complete = peaks.ascend(log_abs, hilbert, starts, max_evaluations=len(starts) + 10)
    assert not complete and np.all(x_KxN == starts) and np.all(value_K == log_abs(starts))


def _heisenberg_chain(n, *extra):
    experiment = build(compose_config([f"hilbert.L={n}", "hilbert.total_sz=0", "hamiltonian=heisenberg",
                                       "hamiltonian.J2=0.3", "sampler=metropolis_exchange", "dtype=complex128",
                                       *extra]))
    problem = experiment.problem
    params = init_state(problem, 0, jnp.ones(n, jnp.int8)).params
    return experiment, problem, params


def _dense_local_energy(experiment, log_psi_D, states_DxN, k):
    h = experiment.hilbert
    H = dense.dense_heisenberg(h.bonds, h.next_bonds, h.n_sites, 1.0, 0.3)
    psi = dense.dense_psi(log_psi_D, states_DxN)
    row = dense.basis_index(states_DxN[k:k + 1])[0]
    return (H @ psi)[row] / psi[row]


@pytest.mark.slow
def test_a_small_space_is_searched_whole_and_the_local_energy_there_is_the_dense_one():
    experiment, problem, params = _heisenberg_chain(8)
    states = all_states(experiment.hilbert)
    log_psi_D = np.asarray(problem.logpsi(params, jnp.asarray(states)))
    k = int(np.argmax(log_psi_D.real))
    result = peaks.check(problem, params, log_psi_D.real[k] - 3.0, states[:0], 0, seed=0)
    assert result["method"] == "exhaustive" and result["starts"] == 0
    np.testing.assert_allclose(result["found_log_abs_max"], log_psi_D.real[k], rtol=1e-12)
    np.testing.assert_allclose(result["log_ratio"], 6.0, rtol=1e-10)
    assert result["configuration"] == "".join("+" if s > 0 else "-" for s in states[k])
    np.testing.assert_allclose(result["local_energy"], _dense_local_energy(experiment, log_psi_D, states, k).real,
                               rtol=1e-10)
    np.testing.assert_allclose(result["log_n_states"], math.log(70), rtol=1e-12)
    # e^6 above the samples in a space of 70 < e^6 states: a bound, but not below P_WRONG
    np.testing.assert_allclose(result["log10_p_bound"], (math.log(70) - 6.0) / math.log(10), rtol=1e-10)
    assert not result["wrong"] and health.check_peaks(result) is None
    same = peaks.check(problem, params, log_psi_D.real[k], states[:0], 0, seed=0)
    assert same["log_ratio"] == 0.0 and same["log10_p_bound"] == 0.0 and same["local_energy"] is None


@pytest.mark.slow
def test_a_planted_peak_is_found_by_the_search_and_proves_the_samples_wrong():
    """An RBM whose one hidden unit is 6 x a target configuration: |psi| peaks on +-target, far
    above any of 2,048 uniform configurations (the 'samples'), in a space of 2.7e6 states."""
    experiment, problem, params = _heisenberg_chain(24, "model=rbm", "model.alpha=0.05")
    hilbert = experiment.hilbert
    target = peaks.uniform_configurations(hilbert, 1, seed=11)[0]
    params = jax.tree_util.tree_map(jnp.zeros_like, params)
    params["kernel"] = params["kernel"].at[:, 0].set(6.0 * target)
    log_abs = peaks.log_abs_evaluator(problem)(params)
    sampled = float(np.max(log_abs(peaks.uniform_configurations(hilbert, 2048, seed=5))))

    result = peaks.check(problem, params, sampled, peaks.uniform_configurations(hilbert, 4, seed=2), 4, seed=0)
    found = np.array([1 if c == "+" else -1 for c in result["configuration"]], np.int8)
    assert result["method"] == "search" and result["starts"] == 8
    assert np.all(found == target) or np.all(found == -target)
    np.testing.assert_allclose(result["found_log_abs_max"], log_abs(target[None])[0], rtol=1e-12)
    assert result["log_ratio"] == 2 * (result["found_log_abs_max"] - sampled) and result["log_ratio"] > 40
    np.testing.assert_allclose(result["log_n_states"], math.log(math.comb(24, 12)), rtol=1e-12)
    assert result["log10_p_bound"] == (result["log_n_states"] - result["log_ratio"]) / math.log(10)
    assert result["wrong"]
    # E_loc at the peak by hand: J1 and J2 bonds, the exchange's ratio from log psi
    e_loc = 0.0
    for bonds, J in ((hilbert.bonds, 1.0), (hilbert.next_bonds, 0.3)):
        for i, j in bonds:
            e_loc += J * found[i] * found[j]
            if found[i] != found[j]:
                swapped = found.copy()
                swapped[[i, j]] = swapped[[j, i]]
                e_loc += 2 * J * np.exp(np.asarray(problem.logpsi(params, jnp.asarray(np.stack([swapped, found]))))
                                        @ np.array([1, -1])).real
    # atol: the RBM's local ratios (cosh d + tanh(theta) sinh d) lose the exchanges' ratios e^-24
    # to cancellation (9e-10 in all); exact to that
    np.testing.assert_allclose(result["local_energy"], e_loc, rtol=0, atol=1e-8)
    name, message = health.check_peaks(result)
    assert name == "unsampled_weight" and "the sampled energy is wrong" in message
    assert [w["name"] for w in health.check({"peak_check": result}, [])] == ["unsampled_weight"]


@pytest.mark.slow
def test_a_run_reports_the_same_check_on_every_layout_and_none_when_asked_or_after_a_full_sum(tmp_path):
    overrides = ["hilbert.L=8", "sampler.n_samples=256", "sampler.n_chains=8", "n_iter=4", "final_rounds=1",
                 "exact=false"]
    experiment = build(compose_config(overrides))
    one = app.execute(experiment, mesh.make_mesh("single"), tmp_path / "single")
    four = app.execute(experiment, mesh.make_mesh("sharded"), tmp_path / "sharded")
    assert one["peak_check"]["method"] == "exhaustive" and one["peak_check"] == four["peak_check"]
    assert one["peak_check"]["found_log_abs_max"] >= one["peak_check"]["sampled_log_abs_max"]
    assert json.loads((tmp_path / "single" / "summary.json").read_text())["peak_check"] == one["peak_check"]
    off = dataclasses.replace(experiment, settings=dataclasses.replace(experiment.settings, peak_search=0))
    assert app.execute(off, mesh.make_mesh("single"), tmp_path / "off")["peak_check"] is None
    summed = build(compose_config([*overrides, "sampler=full_sum"]))
    assert app.execute(summed, mesh.make_mesh("single"), tmp_path / "summed")["peak_check"] is None

