"""Health checks: named warnings for runs whose final numbers say that something went wrong."""

import statistics

from scipy.stats import f as f_distribution

from runner.core.full_sum import FullSumSampler
from runner.core.sampler import ExactSampler
from runner.diagnostics import sectors

ACCEPTANCE_LOW = 0.02  # Metropolis chains that (almost) never move: samples are not independent
ACCEPTANCE_HIGH = 0.98  # proposals (almost) always accepted: a flat or broken amplitude
R_HAT_MAX = 1.1  # Gelman-Rubin split-chain statistic above which chains disagree
FROZEN_ACCEPTANCE = 0.01  # mean Metropolis acceptance below which the chains count as frozen (check_frozen) ...
FROZEN_R_HAT = 1.05  # ... or a split R-hat above this ...
FROZEN_P = 1e-3  # ... that independent draws of as many samples per chain reach with at most this probability
FROZEN_WINDOW = 10  # check_frozen judges the last 1/FROZEN_WINDOW of the steps ...
FROZEN_MIN_STEPS = 3  # ... and at least this many (all of a shorter run's)
UNRELIABLE = ("frozen_chains", "below_exact", "unsampled_weight")  # warnings that void the final energy
BELOW_EXACT_SIGMAS = 3.0  # an energy this many error bars below the exact ground energy
VARIANCE_RISE = 100.0  # final variance against its minimum over the run
VARIANCE_RISE_LATE = 10.0  # median of the last eighth against the eighth before it
V_SCORE_FLOOR = 1e-4  # variances below N * var / E^2 = this count as converged (noise, not growth)
RELATIVE_ERROR_MAX = 1e-1
ESS_LOW = 0.1  # effective sample fraction of importance-weighted training samples (sampler.machine_pow)
DRIFT_SIGMAS = 5.0  # real-time evolution: an energy this many combined error bars from its value at t = 0 ...
DRIFT_RELATIVE = 1e-3  # ... and this fraction of |E(0)| from it (a full sum has no error bars) is not conserved
RESIDUAL_HIGH = 0.03  # TDVP residual r^2 above which the ansatz does not follow the state (docs/diagnostics.md)
STUCK_SIGMAS = 2.0  # an energy within this many combined error bars of its first step's has not moved
STUCK_MIN_STEPS = 10  # fewer steps are not judged by their energies (a debug run of two steps)
ZERO_VARIANCE = 1e-20  # a first step's variance below this fraction of E^2 (rounding only): an eigenstate of H


def _last(records, key):
    for record in reversed(records):
        if record.get(key) is not None:
            return record[key]
    return None


def _final(summary, records, key):
    value = summary.get(key)
    return value if value is not None else _last(records, key)


def metropolis(sampler) -> bool:
    """Whether `sampler` is a Metropolis sampler (the acceptance checks apply)."""
    return not isinstance(sampler, (ExactSampler, FullSumSampler))


def variance_floor(energy, n_sites) -> float:
    """Variances below the V-score floor count as converged (noise, not growth)."""
    return V_SCORE_FLOOR * energy**2 / n_sites if energy and n_sites else 0.0


def check_acceptance(acceptance, metropolis: bool):
    """Metropolis acceptance below ACCEPTANCE_LOW or above ACCEPTANCE_HIGH (not the exact sampler)."""
    if not metropolis or acceptance is None:
        return None
    if acceptance < ACCEPTANCE_LOW:
        return ("acceptance", f"Metropolis acceptance {acceptance:.3f} is below {ACCEPTANCE_LOW}: "
                "the chains hardly move and the samples are not independent")
    if acceptance > ACCEPTANCE_HIGH:
        return ("acceptance", f"Metropolis acceptance {acceptance:.3f} is above {ACCEPTANCE_HIGH}: "
                "the amplitude hardly changes under the proposals")
    return None


def check_r_hat(r_hat):
    if r_hat is None or not r_hat > R_HAT_MAX:
        return None
    return ("r_hat", f"split R-hat {r_hat:.3f} is above {R_HAT_MAX}: the chains have not mixed")


def frozen_window(records: list[dict]) -> list[dict]:
    """The steps `check_frozen` judges: the last tenth of the run, at least FROZEN_MIN_STEPS (all of a
    shorter run's)."""
    return records[-max(FROZEN_MIN_STEPS, -(-len(records) // FROZEN_WINDOW)):] if records else []


def r_hat_chance(r_hat: float, samples_per_chain: int | None, n_chains: int | None) -> float:
    """The probability that chains of independent draws, `samples_per_chain` each, give a split R-hat of
    at least `r_hat`: with half-chains of n samples, n (R^2 - 1) + 1 is the ratio of the variance between
    the halves' means to that within them, F-distributed with (H - 1, H (n - 1)) degrees of freedom
    for H halves. 0 where the counts are unknown (the R-hat is then taken as it is). Short chains
    scatter: 8 samples per chain of 16 chains give R-hat 1.05 with probability 0.1."""
    n, halves = (samples_per_chain or 0) // 2, 2 * (n_chains or 0)
    if n < 2 or halves < 2:
        return 0.0
    return float(f_distribution.sf(1.0 + n * (r_hat**2 - 1.0), halves - 1, halves * (n - 1)))


def _disagree(r_hat, samples_per_chain, n_chains) -> bool:  # R-hat above FROZEN_R_HAT beyond chance
    return r_hat is not None and r_hat > FROZEN_R_HAT and r_hat_chance(r_hat, samples_per_chain, n_chains) < FROZEN_P


def check_frozen(records: list[dict], summary: dict, metropolis: bool, final_rounds: int = 1):
    """Metropolis chains frozen over the last tenth of the run (`frozen_window`) or in the final estimate:
    a mean acceptance below FROZEN_ACCEPTANCE (the window's steps', or the final estimate's), or a split
    R-hat above FROZEN_R_HAT (the median of the window's steps', or the final estimate's) that independent
    draws of as many samples reach with probability below FROZEN_P (`r_hat_chance`). The final energy
    is then unreliable (`UNRELIABLE`). A full sum or the exact sampler is never frozen.

    Args:
        records: metrics.jsonl's records (`step`, `acceptance`, `r_hat`).
        summary: the final estimate's `acceptance`, `r_hat`; `n_samples`, `n_chains` (a step's).
        metropolis, final_rounds: the sampler is a Metropolis sampler; the final estimate's rounds.
    """
    if not metropolis:
        return None
    n_chains = summary.get("n_chains")
    per_step = summary["n_samples"] // n_chains if summary.get("n_samples") and n_chains else None
    window = frozen_window(records)
    acceptance, r_hats = ([r[k] for r in window if r.get(k) is not None] for k in ("acceptance", "r_hat"))
    mean, median = statistics.fmean(acceptance) if acceptance else None, statistics.median(r_hats) if r_hats else None
    found = []
    if mean is not None and mean < FROZEN_ACCEPTANCE:
        found.append(f"the mean Metropolis acceptance was {mean:.3g} (below {FROZEN_ACCEPTANCE:g})")
    if _disagree(median, per_step, n_chains):
        found.append(f"the median split R-hat was {median:.3g} (above {FROZEN_R_HAT:g})")
    if found:
        found[0] = f"over the last {len(window)} steps ({window[0]['step']} to {window[-1]['step']}) " + found[0]
    final_acceptance, final_r_hat = summary.get("acceptance"), summary.get("r_hat")
    if final_acceptance is not None and final_acceptance < FROZEN_ACCEPTANCE:
        found.append(f"the final estimate's acceptance was {final_acceptance:.3g} (below {FROZEN_ACCEPTANCE:g})")
    if _disagree(final_r_hat, per_step and final_rounds * per_step, n_chains):
        found.append(f"the final estimate's split R-hat was {final_r_hat:.3g} (above {FROZEN_R_HAT:g})")
    if not found:
        return None
    return ("frozen_chains", f"frozen chains: {' and '.join(found)}; the chains do not mix, so the samples are not "
            "from |psi|^2 and the final energy is unreliable (more sweeps per sample, an exchange of farther spins, "
            "another seed or learning rate)")


def unreliable(warnings: list[dict]) -> str | None:
    """Why the final energy is not to be trusted: the messages of `warnings` named in UNRELIABLE,
    joined; None when there is none (summary.json's `unreliable`)."""
    reasons = [f"{w['name']}: {w['message']}" for w in warnings if w["name"] in UNRELIABLE]
    return "; ".join(reasons) or None


def check_below_exact(energy, energy_error, exact_energy):
    """A variational energy below the exact ground energy by more than 3 error bars: broken sampling."""
    if energy is None or exact_energy is None:
        return None
    # the relative slack covers rounding when the error bar is ~0 (exact sampler, exact state)
    margin = BELOW_EXACT_SIGMAS * (energy_error or 0.0) + 1e-10 * abs(exact_energy)
    if exact_energy - energy <= margin:
        return None
    return ("below_exact", f"energy {energy:.8f} is below the exact ground energy {exact_energy:.8f} by "
            f"more than {BELOW_EXACT_SIGMAS:g} error bars ({energy_error or 0.0:.1e}): the estimate is "
            "biased (broken sampling), not variational")


def check_variance(final_variance, variances: list[float], energy, n_sites):
    """The variance exploded: final > VARIANCE_RISE x its minimum over the run, or it grew late.

    Variances below the V-score floor (N var / E^2 < V_SCORE_FLOOR) count as converged, so the
    noise of a near-exact state's tiny variance is not taken for growth.
    """
    variances = [v for v in variances if v is not None]
    if final_variance is None or not variances:
        return None
    floor = variance_floor(energy, n_sites)
    lowest = min(variances)
    if final_variance > VARIANCE_RISE * max(lowest, floor):
        return ("variance_exploding", f"final variance {final_variance:.3e} is more than "
                f"{VARIANCE_RISE:g}x its minimum over the run ({lowest:.3e})")
    late = variances[-(len(variances) // 4):] if len(variances) >= 32 else []
    if late:
        half = len(late) // 2
        before, after = statistics.median(late[:half]), statistics.median(late[half:])
        if after > VARIANCE_RISE_LATE * max(before, floor):
            return ("variance_exploding", f"the variance grew over the last quarter of the run (median "
                    f"{before:.3e} -> {after:.3e}, more than {VARIANCE_RISE_LATE:g}x)")
    return None


def check_relative_error(relative_error, sector_relative_error=None):
    """Judged against the lowest exact level of the model's sector where that is not the ground
    energy: a run in a sector that misses the ground state gets the `sector` warning, not this
    one for the gap."""
    in_sector = sector_relative_error is not None and sector_relative_error != relative_error
    error = sector_relative_error if in_sector else relative_error
    if error is None or not error > RELATIVE_ERROR_MAX:
        return None
    against = "its sector's lowest exact level" if in_sector else "the exact ground energy"
    return "relative_error", f"relative error {error:.2e} against {against} is above {RELATIVE_ERROR_MAX:g}"


def check_no_progress(records: list[dict]):
    """A run that never left its start: the variance at its first step is zero (rounding aside;
    the start is an eigenstate of H, whose gradient vanishes), or its last step's energy lies
    within STUCK_SIGMAS combined error bars (and rounding) of its first step's, over at least
    STUCK_MIN_STEPS steps. Its V-score then
    says nothing about convergence: a start that is an eigenstate has a zero variance at any
    energy. Records without an energy or an error bar are not judged."""
    first = next((r for r in records if r.get("energy") is not None), None)
    if first is None:
        return None
    e0, var0 = first["energy"], first.get("variance")
    if var0 is not None and var0 <= ZERO_VARIANCE * max(e0**2, 1.0):
        return ("no_progress", f"the variance was {var0:.1e} at the first step (step {first['step']}, E = {e0:.8g}): "
                "the start is an eigenstate of H, which training cannot leave (its gradient vanishes); the V-score "
                "is not a sign of convergence")
    last = _last_with(records, ("energy", "energy_error"))
    if last is None or first.get("energy_error") is None or last["step"] - first["step"] < STUCK_MIN_STEPS - 1:
        return None
    e1 = last["energy"]
    bar = (first["energy_error"] ** 2 + last["energy_error"] ** 2) ** 0.5
    if abs(e1 - e0) > STUCK_SIGMAS * bar + 1e-10 * abs(e0):
        return None
    return ("no_progress", f"the energy has not moved beyond its error bars since the first step: {e0:.8g} ± "
            f"{first['energy_error']:.1e} at step {first['step']}, {e1:.8g} ± {last['energy_error']:.1e} at step "
            f"{last['step']}: the run never left its start, and the V-score is not a sign of convergence")


def _last_with(records, keys):
    for record in reversed(records):
        if all(record.get(k) is not None for k in keys):
            return record
    return None


def check_cg(cg_iters: list[int], cg_maxiter: int | None):
    """Steps whose conjugate-gradient solve stopped at its iteration limit instead of converging."""
    cg_iters = [n for n in cg_iters if n is not None]
    if not cg_maxiter or not cg_iters:
        return None
    hit = sum(n >= cg_maxiter for n in cg_iters)
    if not hit:
        return None
    return ("cg_maxiter", f"CG stopped at its limit of {cg_maxiter} iterations on {hit} of {len(cg_iters)} "
            "steps: the SR updates were not solved to cg_tol (raise preconditioner.diag_shift or "
            "preconditioner.cg_maxiter)")


def check_ess(ess_fractions: list[float]):
    """Importance-weighted training (sampler.machine_pow != 2) whose median effective sample fraction
    is below ESS_LOW: a few samples carried each step's estimates."""
    ess_fractions = [f for f in ess_fractions if f is not None]
    if not ess_fractions or not statistics.median(ess_fractions) < ESS_LOW:
        return None
    return ("ess_low", f"the median effective sample fraction of the reweighted training samples is "
            f"{statistics.median(ess_fractions):.3f}, below {ESS_LOW:g}: a few samples carried each step "
            "(move sampler.machine_pow closer to 2)")


def check_rejections(records: list[dict]):
    """Steps undone by `reject_jump`: the energy estimate jumped. Where the next step, which
    measures the kept parameters again, shows the same jump, the chains had found configurations
    the state already had (docs/accuracy.md): the estimates before it were wrong."""
    steps = [r["step"] for r in records if r.get("rejected")]
    if not steps:
        return None
    energy = {r["step"]: r.get("energy") for r in records}
    around = [(s, energy.get(s - 1), energy.get(s), energy.get(s + 1)) for s in steps]
    repeated = [s for s, before, jump, again in around if None not in (before, jump, again)
                and again - before > (jump - before) / 2]
    message = (f"{len(steps)} of {len(records)} steps were rejected by reject_jump (the first at step {steps[0]}): "
               "the energy estimate jumped")
    if repeated:
        message += (f"; at step {repeated[0]} the kept parameters, measured again, kept more than half the jump: "
                    "the chains found configurations the state already had, so the estimates before were wrong")
    return ("rejected_steps", message)


def check_recoveries(records: list[dict]):
    """A run that went back to its last good checkpoint after a collapse (`recover`): its
    steps from there on were scaled down (`step_ceiling` below 1 in the records after it)."""
    lowered = [r for r in records if (r.get("step_ceiling") or 1.0) < 1.0]
    if not lowered:
        return None
    ceiling = min(r["step_ceiling"] for r in lowered)
    return ("recovered", f"the run went back to a checkpoint after a collapse (recover) and took its steps from step "
                         f"{lowered[0]['step']} on at most {ceiling:g} of their size; the log says what collapsed")


def check_peaks(peak_check: dict | None):
    """A configuration found by the final peak search (`runner.diagnostics.peaks.check`) that proves the
    samples were not drawn from |psi|^2."""
    if not peak_check or not peak_check.get("wrong"):
        return None
    return ("unsampled_weight",
            f"a configuration with |psi|^2 e^{peak_check['log_ratio']:.1f} times the largest of the samples' was "
            f"found ({peak_check['method']}; E_loc there {peak_check['local_energy']:.6g}): all "
            f"e^{peak_check['log_n_states']:.1f} configurations at or below the samples' largest |psi|^2 weigh less "
            f"than it, so a sample of |psi|^2 lands among them with probability at most "
            f"10^{peak_check['log10_p_bound']:.0f}; the samples are not from |psi|^2 and the sampled energy is wrong")


def check_energy_drift(records: list[dict], real_time: bool):
    """A real-time evolution whose energy left its value at t = 0 by more than DRIFT_SIGMAS combined
    error bars and DRIFT_RELATIVE of |E(0)|: the Hamiltonian conserves it and so does the exact
    TDVP, so the integration went unstable (or the solve dropped what mattered) there."""
    if not real_time or not records or records[0].get("energy") is None:
        return None
    e0, bar0 = records[0]["energy"], records[0].get("energy_error") or 0.0
    for record in records[1:]:
        energy, bar = record.get("energy"), record.get("energy_error") or 0.0
        if energy is not None and abs(energy - e0) > DRIFT_SIGMAS * (bar**2 + bar0**2) ** 0.5 + DRIFT_RELATIVE * abs(e0):
            return ("energy_drift",
                    f"the energy moved from {e0:.8g} at t = {records[0]['t']:.6g} to {energy:.8g} at t = "
                    f"{record['t']:.6g}, more than {DRIFT_SIGMAS:g} error bars and {DRIFT_RELATIVE:g} of |E(0)|; "
                    "real-time evolution conserves it: the trajectory from there on is not the dynamics")
    return None


def check_residual(records: list[dict]):
    """A TDVP residual r^2 above RESIDUAL_HIGH at some saved time: the model's tangent space misses a
    sizeable part of the exact motion there, and the error it makes accumulates from then on."""
    high = [r for r in records if r.get("residual") is not None and r["residual"] > RESIDUAL_HIGH]
    if not high:
        return None
    worst = max(high, key=lambda r: r["residual"])
    return ("tdvp_residual",
            f"the TDVP residual r^2 passed {RESIDUAL_HIGH:g} at t = {high[0]['t']:.6g} (largest {worst['residual']:.2g} "
            f"at t = {worst['t']:.6g}): the model cannot follow the state there, and observables from then on may be "
            "off by more than their error bars")


def check_dynamics(records: list[dict], *, real_time: bool, metropolis: bool = True) -> list[dict]:
    """Every health warning of a time evolution from trajectory.jsonl's `records` (`t`, `energy`,
    `energy_error`, `residual`, `acceptance`), as `check` gives them."""
    found = [
        check_acceptance(_last(records, "acceptance"), metropolis),
        check_energy_drift(records, real_time),
        check_residual(records),
    ]
    return [{"name": name, "message": message} for name, message in filter(None, found)]


def check(summary: dict, records: list[dict], *, metropolis: bool = True,
          cg_maxiter: int | None = None, final_rounds: int = 1) -> list[dict]:
    """Every health warning of a run.

    Args:
        summary: summary.json's fields (`energy`, `energy_error`, `variance`, `acceptance`,
            `r_hat`, `exact_energy`, `relative_error`, `sector_relative_error`, `n_sites`,
            `n_samples`, `n_chains`, `peak_check`; any may be None or missing).
        records: metrics.jsonl's records, one per step (`variance`, `acceptance`, `r_hat`, optional
            `cg_iters`, `ess_fraction`, `rejected` and `step_ceiling`).
        metropolis: the sampler is a Metropolis sampler (the acceptance and frozen checks apply).
        cg_maxiter: the CG iteration limit, when the preconditioner solves with CG.
        final_rounds: the final estimate's rounds of `n_samples` (`check_frozen`).

    Returns:
        A list of {"name", "message"}, in a fixed order; empty for a healthy run.
    """
    energy = summary.get("energy")
    found = [
        check_acceptance(_final(summary, records, "acceptance"), metropolis),
        check_r_hat(_final(summary, records, "r_hat")),
        check_frozen(records, summary, metropolis, final_rounds),
        check_below_exact(energy, summary.get("energy_error"), summary.get("exact_energy")),
        check_variance(_final(summary, records, "variance"), [r.get("variance") for r in records],
                       energy if energy is not None else _last(records, "energy"), summary.get("n_sites")),
        check_relative_error(summary.get("relative_error"),
                             summary.get("sector_relative_error") if sectors.misses_ground(summary) else None),
        check_no_progress(records),
        check_cg([r.get("cg_iters") for r in records], cg_maxiter),
        check_ess([r.get("ess_fraction") for r in records]),
        check_rejections(records),
        check_recoveries(records),
        check_peaks(summary.get("peak_check")),
        sectors.check(summary),
    ]
    return [{"name": name, "message": message} for name, message in filter(None, found)]
