"""Frozen chains (issue 58 item 4): `health.check_frozen` on synthetic records, and real short runs whose
chains are frozen (one proposal between samples) or not, as summary.json marks them."""

import pytest

from runner import app
from runner.config.build import build
from runner.diagnostics import health
from runner.parallel import mesh
from tests.helpers.config import compose_config


def steps(n, acceptance=0.4, r_hat=1.01, **extra):
    return [{"step": k, "energy": -10.0, "variance": 1.0, "acceptance": acceptance, "r_hat": r_hat, **extra}
            for k in range(n)]


def frozen(records, final_acceptance=0.4, final_r_hat=1.0, metropolis=True, n_samples=1024, final_rounds=1):
    summary = {"acceptance": final_acceptance, "r_hat": final_r_hat, "n_samples": n_samples, "n_chains": 16}
    return health.check_frozen(records, summary, metropolis, final_rounds)


def test_the_window_is_the_last_tenth_and_at_least_three_steps():
    assert [len(health.frozen_window(steps(n))) for n in (0, 1, 3, 20, 30, 31, 200)] == [0, 1, 3, 3, 3, 4, 20]
    assert health.frozen_window(steps(200))[0]["step"] == 180


def test_the_published_kagome_numbers_are_frozen():
    """Acceptance 0 and split R-hat 1.39 over the last tenth: the '108-site record below DMRG'."""
    name, message = frozen(steps(100, acceptance=0.0, r_hat=1.39), final_acceptance=0.0, final_r_hat=1.39)
    assert name == "frozen_chains"
    for text in ("last 10 steps (90 to 99)", "acceptance was 0 (below 0.01)", "R-hat was 1.39 (above 1.05)",
                 "final estimate's acceptance was 0", "final estimate's split R-hat was 1.39", "unreliable"):
        assert text in message, message


@pytest.mark.parametrize("acceptance,r_hat,final,expected", [
    (0.4, 1.01, 0.4, None),       # healthy
    (0.009, 1.01, 0.4, "mean Metropolis acceptance"),  # chains that agree but hardly move
    (0.011, 1.01, 0.4, None),
    (0.4, 1.06, 0.4, "median split R-hat"),  # chains that move but disagree
    (0.4, 1.04, 0.4, None),
    (0.4, None, 0.4, None),       # not finite on every step: not judged by R-hat
    (0.4, 1.01, 0.005, "final estimate's acceptance"),
])
def test_each_criterion(acceptance, r_hat, final, expected):
    found = frozen(steps(50, acceptance, r_hat), final_acceptance=final)
    assert (found is None) if expected is None else (expected in found[1]), found


def test_an_r_hat_is_judged_against_what_independent_chains_of_its_length_reach():
    """8 samples per chain of 16 chains: independent draws reach R-hat 1.06 with probability 0.07 (not
    frozen), 1.2 with below 1e-3 (frozen); 64 samples per chain, e.g. a final estimate's 8 rounds of 8,
    reach 1.05 with 2e-13 (frozen)."""
    assert health.r_hat_chance(1.06, 8, 16) == pytest.approx(0.0717, abs=1e-4)
    assert health.r_hat_chance(1.05, 64, 16) < 1e-12
    assert health.r_hat_chance(1.5, None, 16) == 0.0  # counts unknown: taken as it is
    assert frozen(steps(30, r_hat=1.06), n_samples=128) is None
    assert "median split R-hat was 1.2" in frozen(steps(30, r_hat=1.2), n_samples=128)[1]
    assert frozen(steps(30), final_r_hat=1.06, n_samples=128) is None
    assert "final estimate's split R-hat" in frozen(steps(30), final_r_hat=1.06, n_samples=128, final_rounds=8)[1]


def test_only_the_last_tenth_counts_and_the_mean_and_median_are_judged():
    early_frozen = steps(100, acceptance=0.0, r_hat=2.0)[:90] + steps(100)[90:]
    assert frozen(early_frozen) is None
    late = steps(100)[:90] + steps(100, acceptance=0.0, r_hat=2.0)[90:]
    assert frozen(late)[0] == "frozen_chains"
    one_noisy = steps(100)
    one_noisy[-1] = {**one_noisy[-1], "r_hat": 1.5}  # a single step's R-hat above: the median is not
    assert frozen(one_noisy) is None
    mean_low = steps(100, acceptance=0.0)[:95] + steps(100, acceptance=0.015)[95:]  # some steps above 1 %
    assert "mean Metropolis acceptance was 0.0075" in frozen(mean_low)[1]


def test_a_full_sum_or_the_exact_sampler_is_never_frozen():
    assert frozen(steps(50, acceptance=0.0, r_hat=3.0), final_acceptance=0.0, metropolis=False) is None
    assert health.check({"acceptance": 0.0}, steps(50, acceptance=0.0, r_hat=None), metropolis=False) == []


def test_a_run_without_steps_is_judged_by_its_final_estimate():
    assert frozen([], final_acceptance=0.4) is None
    assert "final estimate's acceptance" in frozen([], final_acceptance=0.0)[1]


def test_unreliable_names_every_warning_that_voids_the_energy():
    summary = {"energy": -1.0, "energy_error": 0.01, "exact_energy": -0.9, "acceptance": 0.4, "r_hat": 1.2}
    warnings = health.check(summary, steps(30, acceptance=0.001))
    assert [w["name"] for w in warnings] == ["r_hat", "frozen_chains", "below_exact"]
    reason = health.unreliable(warnings)
    assert reason.startswith("frozen_chains: frozen chains: over the last 3 steps") and "; below_exact: " in reason
    assert health.unreliable([{"name": "acceptance", "message": "low"}, {"name": "r_hat", "message": "1.2"}]) is None
    assert health.unreliable([]) is None


# TFIM chain of 8 sites, a few steps: with one proposal between samples (sweep_size=1) a chain's 8 samples
# per step are nearly one configuration, so the chains disagree (split R-hat far above 1.05).
RUN = ["hilbert.L=8", "sampler.n_samples=128", "sampler.n_chains=16", "n_iter=6", "final_rounds=1",
       "exact=false", "peak_search=0"]


@pytest.mark.parametrize("sweep_size,reliable", [(1, False), (None, True)])
def test_a_real_run_whose_chains_freeze_is_marked_unreliable(tmp_path, sweep_size, reliable):
    overrides = RUN + ([f"sampler.sweep_size={sweep_size}"] if sweep_size else [])
    summary = app.execute(build(compose_config(overrides)), mesh.make_mesh("single"), tmp_path)
    assert summary["status"] == "completed"
    names = [w["name"] for w in summary["warnings"]]
    assert ("frozen_chains" in names) != reliable, summary["warnings"]
    assert (summary["unreliable"] is None) == reliable, summary["unreliable"]
    if not reliable:
        assert "frozen_chains: frozen chains: over the last 3 steps (3 to 5)" in summary["unreliable"]
