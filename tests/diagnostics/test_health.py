"""runner.diagnostics.health: each named warning fires on the numbers of a broken run and not on a healthy one."""

import pytest

from runner.diagnostics import collapse, health

HEALTHY = {"energy": -44.85, "energy_error": 0.01, "variance": 0.5, "acceptance": 0.4, "r_hat": 1.01,
           "exact_energy": -44.9139, "relative_error": 1.4e-3, "n_sites": 16}


def records(variances, **extra):
    return [{"step": i, "energy": -44.0, "variance": v, **extra} for i, v in enumerate(variances)]


def names(summary, recs=(), **kwargs):
    return [w["name"] for w in health.check(summary, list(recs), **kwargs)]


def test_healthy_run_has_no_warning():
    recs = records([50.0 / (1 + i) + 0.5 for i in range(200)], acceptance=0.4)
    assert health.check(HEALTHY, recs) == []


def test_collapsed_run_of_the_issue_gets_every_warning():
    """diag_shift=1e-3 on the 4x4 Heisenberg: E -21.0 vs exact -44.9, acceptance 0, r_hat 9.5."""
    summary = {**HEALTHY, "energy": -21.0, "energy_error": 0.0, "acceptance": 0.0, "r_hat": 9.5,
               "variance": 0.0, "relative_error": 23.9 / 44.9}
    got = health.check(summary, records([1.0, 0.0]))
    assert [w["name"] for w in got] == ["acceptance", "r_hat", "frozen_chains", "relative_error"]
    assert "0.000" in got[0]["message"] and "9.500" in got[1]["message"] and "5.32e-01" in got[3]["message"]


@pytest.mark.parametrize("acceptance,metropolis,warned", [
    (0.01, True, True), (0.99, True, True), (0.5, True, False), (0.02, True, False),
    (1.0, False, False),  # the exact sampler accepts every draw
])
def test_acceptance(acceptance, metropolis, warned):
    assert ("acceptance" in names({**HEALTHY, "acceptance": acceptance}, metropolis=metropolis)) == warned


def test_acceptance_falls_back_to_the_last_step():
    assert names({**HEALTHY, "acceptance": None}, records([0.5, 0.5], acceptance=0.0)) == ["acceptance", "frozen_chains"]


def test_r_hat():
    assert names({**HEALTHY, "r_hat": 1.2}) == ["r_hat", "frozen_chains"]  # also above check_frozen's 1.05
    assert names({**HEALTHY, "r_hat": 1.09}) == ["frozen_chains"]
    assert names({**HEALTHY, "r_hat": 1.04}) == []


def test_energy_below_exact_by_more_than_three_error_bars():
    exact = HEALTHY["exact_energy"]
    assert names({**HEALTHY, "energy": exact - 0.031, "relative_error": 7e-4}) == ["below_exact"]
    assert names({**HEALTHY, "energy": exact - 0.029, "relative_error": 6e-4}) == []
    # an exact-sampler estimate of an exact state: rounding below, no error bar
    assert names({**HEALTHY, "energy": exact * (1 + 1e-13), "energy_error": 0.0, "relative_error": 0}) == []


def test_variance_exploding_against_its_minimum():
    recs = records([5.0, 1.0, 0.2, 0.3, 30.0])
    assert names({**HEALTHY, "variance": 30.0}, recs) == ["variance_exploding"]
    assert names({**HEALTHY, "variance": 15.0}, recs) == []


def test_variance_growing_over_the_last_quarter():
    rising = [1.0] * 80 + [1.0] * 10 + [20.0] * 10
    assert names({**HEALTHY, "variance": 20.0}, records(rising)) == ["variance_exploding"]
    assert names({**HEALTHY, "variance": 1.0}, records([1.0] * 100)) == []


def test_variance_noise_of_a_near_exact_state_is_not_growth():
    # V-score ~1e-9: a factor 100 between tiny variances is noise, not an explosion
    tiny = [1e-9, 1e-7] * 50
    assert names({**HEALTHY, "variance": 2e-7}, records(tiny)) == []


def test_relative_error():
    assert names({**HEALTHY, "relative_error": 0.2, "energy": -36.0}) == ["relative_error"]
    assert names({**HEALTHY, "exact_energy": None, "relative_error": None}) == []


def test_relative_error_of_a_run_in_a_sector_is_judged_against_its_sector():
    """A run in a sector without the ground state (the tower of states) is not warned for the gap
    (the `sector` warning names both levels); far from its own sector's level it is."""
    assert health.check_relative_error(0.16, 3e-9) is None
    name, message = health.check_relative_error(0.16, 0.12)
    assert name == "relative_error" and "1.20e-01 against its sector's lowest exact level" in message
    assert "against the exact ground energy" in health.check_relative_error(0.2)[1]
    assert "against the exact ground energy" in health.check_relative_error(0.2, 0.2)[1]  # the same level


def test_a_run_in_the_ground_sector_is_judged_against_the_ground_energy():
    """The ground sector's level from the spectrum and the ground energy from the whole space differ
    in their last digits (the kagome 2x2 recipe's two solvers: -21.779500867887105 and
    -21.779500867887435): the same level, so the ground energy's wording, and no `sector` warning."""
    summary = {**HEALTHY, "energy": -17.4, "exact_energy": -21.779500867887105, "relative_error": 0.2,
               "sector_exact_energy": -21.779500867887435, "sector_relative_error": 0.2000000000000030}
    warnings = health.check(summary, [])
    assert [w["name"] for w in warnings] == ["relative_error"]
    assert "against the exact ground energy" in warnings[0]["message"]
    far = {**summary, "sector_exact_energy": -21.3, "sector_relative_error": 0.18}
    messages = {w["name"]: w["message"] for w in health.check(far, [])}
    assert sorted(messages) == ["relative_error", "sector"]
    assert "1.80e-01 against its sector's lowest exact level" in messages["relative_error"]


def test_cg_at_its_iteration_limit_is_optional():
    recs = records([0.5] * 10, cg_iters=120)
    recs[-1]["cg_iters"] = 1000
    got = health.check(HEALTHY, recs, cg_maxiter=1000)
    assert [w["name"] for w in got] == ["cg_maxiter"] and "1 of 10" in got[0]["message"]
    assert names(HEALTHY, recs) == []  # no CG limit known
    assert names(HEALTHY, records([0.5] * 10), cg_maxiter=1000) == []  # metrics without cg_iters


def test_importance_weights_carried_by_few_samples():
    got = health.check(HEALTHY, records([0.5] * 10, ess_fraction=0.05))
    assert [w["name"] for w in got] == ["ess_low"] and "0.050" in got[0]["message"]
    assert names(HEALTHY, records([0.5] * 10, ess_fraction=0.6)) == []
    assert names(HEALTHY, records([0.5] * 10)) == []  # samples of |psi|^2: no weights


def test_rejected_steps_are_reported_and_a_repeated_jump_called_wrong_estimates():
    energies = [-10.0, -10.5, -11.0, 50.0, -11.1, -11.2]  # step 3 rejected, step 4 measured the kept state: fine
    recs = [{"step": i, "energy": e, "variance": 1.0, "rejected": int(i == 3)} for i, e in enumerate(energies)]
    got = health.check(HEALTHY, recs)
    assert [w["name"] for w in got] == ["rejected_steps"]
    assert "1 of 6 steps were rejected" in got[0]["message"] and "first at step 3" in got[0]["message"]
    assert "estimates before were wrong" not in got[0]["message"]
    recs[4]["energy"] = 45.0  # the kept state shows the jump again
    assert "at step 3 the kept parameters" in health.check(HEALTHY, recs)[0]["message"]
    assert names(HEALTHY, [{**r, "rejected": 0} for r in recs]) == []
    recs[4]["energy"] = None  # a step without a number (NaN in metrics.jsonl): no verdict on it
    assert "kept parameters" not in health.check(HEALTHY, recs)[0]["message"]


def test_failed_run_without_final_numbers():
    assert health.check({"status": "failed"}, []) == []


def collapse_records(acceptance, r_hat, variance, n=collapse.COLLAPSE_STEPS + 10):
    """n steps: healthy ones, then COLLAPSE_STEPS steps with the given acceptance, R-hat and variance."""
    healthy = [{"step": k, "energy": -10.0, "variance": 1.0, "acceptance": 0.4, "r_hat": 1.01}
               for k in range(n - collapse.COLLAPSE_STEPS)]
    late = [{"step": k, "energy": -5.0, "variance": variance, "acceptance": acceptance, "r_hat": r_hat}
            for k in range(n - collapse.COLLAPSE_STEPS, n)]
    return healthy + late


@pytest.mark.parametrize("acceptance,r_hat,variance,metropolis,expected", [
    (0.001, 3.0, 1.0, True, "frozen apart"),
    (0.001, None, 1.0, True, "frozen apart"),  # a non-finite R-hat: chains each on one configuration
    (0.001, 1.01, 1.0, True, None),  # a peaked state whose chains agree (an ordered phase): healthy
    (0.001, 3.0, 1.0, False, None),  # no Metropolis chains
    (0.3, 3.0, 1.0, True, None),
    (0.3, 1.01, 1e3, True, "variance stayed above"),
    (0.3, 1.01, 50.0, True, None),  # below VARIANCE_RISE x the earlier minimum
])
def test_check_collapse(acceptance, r_hat, variance, metropolis, expected):
    records = collapse_records(acceptance, r_hat, variance)
    reason = collapse.check_collapse(records, n_sites=16, metropolis=metropolis)
    assert (reason is None) if expected is None else (reason.startswith("collapsed:") and expected in reason)
    # one step short of the window of steps: never
    assert collapse.check_collapse(records[:-1] if expected else records[:collapse.COLLAPSE_STEPS - 1], 16, True) is None


def test_a_single_bad_step_in_the_window_is_not_a_collapse():
    records = collapse_records(0.001, 3.0, 1e3)
    records[-5] = {**records[-5], "acceptance": 0.3, "variance": 1.0}
    assert collapse.check_collapse(records, n_sites=16, metropolis=True) is None


def test_a_run_leaving_the_eigenstate_it_started_in_is_not_a_collapse():
    """The README's kagome example starts near the ferromagnet (an eigenstate: variance 0.04) and
    its variance rises to ~20-90 while the energy falls from +24 to -18: healthy, not stopped.
    The same variances under a flat energy are a collapse."""
    energies = [24.0 - 2.0 * k for k in range(collapse.COLLAPSE_STEPS + 7)]
    records = [{"step": k, "energy": e, "energy_error": 0.3, "variance": 0.04 if k < 7 else 20.0,
                "acceptance": 0.3, "r_hat": 1.0} for k, e in enumerate(energies)]
    assert collapse.check_collapse(records, n_sites=12, metropolis=True) is None
    flat = [{**r, "energy": 24.0} for r in records]
    assert collapse.check_collapse(flat, n_sites=12, metropolis=True).startswith("collapsed: the variance")


@pytest.mark.parametrize("acceptance,variance,metropolis,expected", [
    (0.001, 1.0, True, True), (0.001, 1.0, False, False), (0.3, 1e3, True, True), (0.3, 50.0, True, False),
    (0.3, 1.0, True, False)])
def test_collapsing_is_the_newest_step_of_a_collapse(acceptance, variance, metropolis, expected):
    """`collapsing` judges the newest step by what `check_collapse` needs COLLAPSE_STEPS of: one
    frozen or risen step holds a checkpoint back."""
    records = collapse_records(acceptance, 3.0, variance)[:-collapse.COLLAPSE_STEPS + 1]
    assert collapse.collapsing(records, n_sites=16, metropolis=metropolis) is expected
    assert collapse.collapsing(records[:-1], n_sites=16, metropolis=metropolis) is False


def test_a_variance_rising_while_the_energy_falls_holds_nothing():
    energies = [24.0 - 2.0 * k for k in range(12)]
    records = [{"step": k, "energy": e, "energy_error": 0.3, "variance": 0.04 if k < 7 else 20.0,
                "acceptance": 0.3, "r_hat": 1.0} for k, e in enumerate(energies)]
    assert not collapse.collapsing(records, n_sites=12, metropolis=True)
    assert collapse.collapsing([{**r, "energy": 24.0} for r in records], n_sites=12, metropolis=True)


def trajectory(energies, errors=0.0, residuals=0.001, acceptance=0.5):
    """trajectory.jsonl records at t = 0, 0.1, ...; scalars repeat."""
    n = len(energies)
    errors = errors if isinstance(errors, list) else [errors] * n
    residuals = residuals if isinstance(residuals, list) else [residuals] * n
    return [{"t": 0.1 * i, "energy": e, "energy_error": s, "residual": r, "acceptance": acceptance}
            for i, (e, s, r) in enumerate(zip(energies, errors, residuals))]


def test_a_healthy_time_evolution_has_no_warning():
    """The sampled 1-D quench's numbers: E within 0.07 of its start, error bars 0.03, r^2 below 0.03."""
    recs = trajectory([-47.7149, -47.69, -47.76, -47.66], errors=0.03, residuals=[3e-4, 1e-2, 2e-2, 2.9e-2])
    assert health.check_dynamics(recs, real_time=True) == []


def test_energy_not_conserved_in_real_time():
    """The full-sum CNN quench on 12 sites (rcond 1e-6): E held to 1e-7 until t = 0.35, then -14.57 at
    t = 0.7 and +3.77 at t = 1.15; the first record past both margins is named."""
    recs = trajectory([-14.28369062, -14.28369066, -14.2837, -14.57065486, 3.77311687])
    got = health.check_dynamics(recs, real_time=True, metropolis=False)
    assert [w["name"] for w in got] == ["energy_drift"]
    assert "-14.570655 at t = 0.3" in got[0]["message"]
    # within 5 error bars, or within 1e-3 of |E(0)|, or in imaginary time (E falls): no warning
    assert health.check_energy_drift(trajectory([-10.0, -10.4], errors=0.1), real_time=True) is None
    assert health.check_energy_drift(trajectory([-10.0, -10.009]), real_time=True) is None
    assert health.check_energy_drift(trajectory([-10.0, -14.0]), real_time=False) is None


def test_a_residual_the_model_cannot_follow():
    """The 12-site quench with the symmetric RBM (alpha 2, summed exactly): r^2 passes 0.03 at
    t = 0.95, where the error in <X> starts to grow past 2e-3."""
    recs = trajectory([-14.3] * 4, residuals=[3.6e-4, 2.2e-2, 3.8e-2, 8.9e-2])
    got = health.check_dynamics(recs, real_time=True)
    assert [w["name"] for w in got] == ["tdvp_residual"]
    assert "passed 0.03 at t = 0.2 (largest 0.089 at t = 0.3" in got[0]["message"]


def test_time_evolution_acceptance_is_the_last_record_s():
    recs = trajectory([-1.0, -1.0], acceptance=0.001)
    assert [w["name"] for w in health.check_dynamics(recs, real_time=True)] == ["acceptance"]
    assert health.check_dynamics(recs, real_time=True, metropolis=False) == []


# --- a run that never left its start (issue 56 item 5) ------------------------------------------

def test_a_start_that_is_an_eigenstate_is_not_convergence(caplog):
    """gcnn on the 6x6 triangular lattice: E = +108 exactly (the flat Sz = 0 state), variance 0."""
    from runner.outputs import summary as summary_mod

    flat = [{"step": i, "energy": 108.0, "energy_error": 0.0, "variance": 0.0} for i in range(50)]
    summary = {**HEALTHY, "energy": 108.0, "energy_error": 0.0, "variance": 1e-12, "v_score": 1.2e-8,
               "relative_error": None, "exact_energy": None, "n_sites": 36, "status": "completed",
               "seconds_per_iter": None}
    got = health.check(summary, flat)
    assert [w["name"] for w in got] == ["no_progress"]
    assert "eigenstate" in got[0]["message"] and "not a sign of convergence" in got[0]["message"]
    summary["warnings"] = got
    with caplog.at_level("INFO", logger="runner"):
        summary_mod.report(summary)
    assert "V-score 1.20e-08: not convergence" in caplog.text
    assert "health warning [no_progress]" in caplog.text


def test_an_energy_within_its_error_bars_of_its_start_has_not_moved():
    stuck = [{"step": i, "energy": -44.0 + 0.01 * (i % 2), "energy_error": 0.05, "variance": 0.5} for i in range(40)]
    got = health.check(HEALTHY, stuck)
    assert [w["name"] for w in got] == ["no_progress"] and "has not moved beyond its error bars" in got[0]["message"]
    moved = [{**r, "energy": -40.0 - 0.1 * r["step"]} for r in stuck]
    assert health.check(HEALTHY, moved) == []
    # exact sampler: no error bars, any change is a move
    exact = [{"step": i, "energy": -44.0 - 1e-6 * i, "energy_error": 0.0, "variance": 0.5} for i in range(5)]
    assert health.check(HEALTHY, exact) == []


def test_a_healthy_report_does_not_flag_the_v_score(caplog):
    from runner.outputs import summary as summary_mod

    summary = {**HEALTHY, "v_score": 1e-3, "status": "completed", "seconds_per_iter": None, "warnings": []}
    with caplog.at_level("INFO", logger="runner"):
        summary_mod.report(summary)
    assert "(V-score 1.00e-03)" in caplog.text and "not convergence" not in caplog.text


def test_a_short_run_is_not_judged_by_its_energies():
    short = [{"step": i, "energy": -44.0, "energy_error": 0.05, "variance": 0.5} for i in range(health.STUCK_MIN_STEPS - 1)]
    assert health.check(HEALTHY, short) == []
    assert names(HEALTHY, [*short, {**short[-1], "step": health.STUCK_MIN_STEPS - 1}]) == ["no_progress"]
