"""A run's summary (summary.json's fields) and the console report of it."""

import dataclasses
import logging
import math
import statistics

from runner.config import fingerprint
from runner.core.estimate import final_burn_in
from runner.diagnostics import health, sectors
from runner.parallel import distributed

log = logging.getLogger(__name__)

WARMUP_STEPS = 2  # excluded from seconds_per_iter

UNIT_FIELDS = ("energy_per_site", "energy_error_per_site", "exact_energy_per_site", "energy_unit")  # per site and the unit, beside the totals
HEALTH_FIELDS = ("unreliable",)  # null, or why the final energy is not to be trusted (health.unreliable)


def finite(x) -> float | None:
    """`x` as a float, None where it is not finite (JSON has no NaN or infinity)."""
    x = float(x)
    return x if math.isfinite(x) else None


def v_score(n_sites: int, energy, variance) -> float | None:
    """N Var(E_loc) / E^2, None without an energy or a variance."""
    return n_sites * variance / energy**2 if energy and variance is not None else None


def relative_error(energy, exact_energy) -> float | None:
    """|E - E_exact| / |E_exact|, None without both."""
    return abs(energy - exact_energy) / abs(exact_energy) if energy is not None and exact_energy else None


# Every Hamiltonian here is a sum of Pauli strings: energies are in units of the Pauli matrices
# (sigma = 2 S). For the spin-spin models sigma.sigma = 4 S.S: a quarter of the energy is its
# value in S.S units.
PAULI = "Pauli (sigma = 2S)"
SPIN_SPIN_TARGETS = ("heisenberg", "xxz")


def energy_unit(target: str | None) -> str:
    """The unit of a Hamiltonian's energies from its `_target_`: Pauli matrices, with the S.S
    conversion named for the Heisenberg and XXZ models (their terms are sigma.sigma = 4 S.S)."""
    name = str(target or "").rpartition(".")[2]
    if name in SPIN_SPIN_TARGETS:
        return "Pauli (sigma.sigma = 4 S.S)"  # E/4 in S.S units
    return PAULI


def per_site(value, n_sites: int) -> float | None:
    """`value` / N, None without a value."""
    return value / n_sites if value is not None and n_sites else None


def estimate_fields(n_sites: int, final: dict, exact_energy: float | None) -> dict:
    """A final estimate's fields in a summary (and in runner.evaluate's result).

    Args:
        n_sites: the lattice's sites (for the V-score).
        final: the estimate's metrics (`runner.lifecycle.finish.final_estimate`); empty for none.
        exact_energy: the exact ground energy, or None.
    """
    energy, variance = final.get("energy"), final.get("variance")
    return {
        "energy": energy,
        "energy_error": final.get("energy_error"),
        "variance": variance,
        "v_score": v_score(n_sites, energy, variance),
        "r_hat": final.get("r_hat"),
        "tau_corr": final.get("tau_corr"),
        "acceptance": final.get("acceptance"),
        "exact_energy": exact_energy,
        "relative_error": relative_error(energy, exact_energy),
        "energy_per_site": per_site(energy, n_sites),
        "energy_error_per_site": per_site(final.get("energy_error"), n_sites),
        "exact_energy_per_site": per_site(exact_energy, n_sites),
    }


@dataclasses.dataclass(frozen=True)
class Timings:
    """How long a run took, in seconds (None for what it did not get to)."""

    seconds_per_iter: float | None  # the median step, the first `WARMUP_STEPS` left out
    compile_seconds: float | None
    first_step_seconds: float | None
    wall_seconds: float

    @classmethod
    def of(cls, step_times: list, compile_seconds: float | None, wall_seconds: float) -> "Timings":
        timed = step_times[WARMUP_STEPS:] or step_times
        return cls(statistics.median(timed) if timed else None, compile_seconds,
                   step_times[0] if step_times else None, wall_seconds)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a run ended with, for its summary."""

    status: str  # completed, failed, preempted or interrupted
    reason: str | None  # why it did not complete
    final: dict  # the final estimate's metrics; empty unless completed
    exact_energy: float | None
    n_params: int
    timings: Timings
    peak_check: dict | None = None  # runner.diagnostics.peaks.check_estimate's
    observed: dict | None = None  # with observables: their summary fields
    sector: dict | None = None  # runner.lifecycle.sector_check.fields: the symmetry sectors' fields


def _cg_maxiter(problem) -> int | None:
    """The SR solver's CG iteration limit (None without CG): the health check's reference."""
    update = problem.precondition.update
    keywords = getattr(update, "keywords", {})  # sr() binds its settings with functools.partial
    return keywords.get("maxiter") if keywords.get("solver") in ("cg", "auto") else None


def layout_fields(experiment, layout) -> dict:
    """Where a run ran: its parallel backend, processes and devices (summary fields of every task)."""
    return {"backend": experiment.parallel["backend"], "processes": distributed.process_count(),
            "devices": layout.n_devices}


def summarise(experiment, layout, outcome: Outcome, records: list[dict]) -> dict:
    """summary.json's fields: the final estimate, the run's shape and timings, its fingerprint and
    (for a completed run) its health warnings.

    Args:
        experiment: the run's `runner.config.build.Experiment`.
        layout: its `runner.parallel.mesh.Layout`.
        outcome: how the run ended.
        records: metrics.jsonl's records, one per step done.
    """
    problem, settings = experiment.problem, experiment.settings
    completed = outcome.status == "completed"
    out = {
        "status": outcome.status,
        **estimate_fields(experiment.hilbert.n_sites, outcome.final, outcome.exact_energy),
        "energy_unit": energy_unit(settings.fingerprint.get("hamiltonian._target_")),
        "n_iter": settings.n_iter,
        "steps_done": len(records),
        "n_params": int(outcome.n_params),
        "n_sites": experiment.hilbert.n_sites,
        "n_samples": problem.sampler.n_samples,
        "n_chains": problem.sampler.n_chains,
        "dtype": experiment.dtype_name,
        "seed": settings.seed,
        **layout_fields(experiment, layout),
        **dataclasses.asdict(outcome.timings),
        "reason": outcome.reason,
        "peak_check": outcome.peak_check,
        "final_burn_in": final_burn_in(problem.sampler) if completed else None,
        **(outcome.observed or {}),
        **(outcome.sector or {}),
    }
    fingerprint.stamp(out, settings.fingerprint)
    # judged on completed runs only: a stopped run has no final estimate to judge
    out["warnings"] = health.check(out, records,
                                   metropolis=health.metropolis(problem.sampler),
                                   cg_maxiter=_cg_maxiter(problem),
                                   final_rounds=settings.final_rounds) if completed else []
    out["unreliable"] = health.unreliable(out["warnings"])
    return out


def report(summary: dict):
    """The summary on the console (the log): energy, exact energy, timings, reason, warnings."""
    lines = [f"status: {summary['status']}"]
    stuck = any(w["name"] == "no_progress" for w in summary.get("warnings", []))
    if summary["energy"] is not None:
        flag = ": not convergence, the run never left its start" if stuck else ""
        unsure = "; UNRELIABLE, see the warnings" if summary.get("unreliable") else ""
        lines.append(f"energy: {summary['energy']:.10f} ± {summary['energy_error']:.2e}{_per_site(summary, 'energy')}  "
                     f"(V-score {summary['v_score']:.2e}{flag}{unsure})")
    if summary["exact_energy"] is not None:
        lines.append(f"exact:  {summary['exact_energy']:.10f}{_per_site(summary, 'exact_energy')}")
    if summary.get("energy_unit") and (summary["energy"] is not None or summary["exact_energy"] is not None):
        lines.append(f"energy unit: {summary['energy_unit']}")
    if summary["seconds_per_iter"] is not None:
        lines.append(f"time per iteration: {1e3 * summary['seconds_per_iter']:.2f} ms; "
                     f"compile {summary['compile_seconds']:.2f} s; wall {summary['wall_seconds']:.1f} s")
    if summary["relative_error"] is not None:  # the last line: against the ground state and the sector's level
        lines.append(relative_error_line(summary))
    for line in lines:
        log.info(line)
    if summary.get("reason"):
        log.warning("%s: %s", summary["status"], summary["reason"])
    log_warnings(summary)


def _per_site(summary: dict, key: str) -> str:
    """`  (E/N = ... ± ...)` for the report's energy lines, empty without a site count."""
    n = summary.get("n_sites")
    if not n or summary.get(key) is None:
        return ""
    error = summary.get(f"{key}_error")
    return f"  ({key.replace('_', ' ')}/N = {summary[key] / n:.10f}" + (f" ± {error / n:.2e})" if error is not None else ")")


def relative_error_line(summary: dict) -> str:
    """The relative error against the exact ground energy and, where the run's sector misses the
    ground state, against the lowest exact level of that sector."""
    line = f"relative error: {summary['relative_error']:.2e}"
    in_sector = summary.get("sector_relative_error")
    if in_sector is None:
        return line
    if not sectors.misses_ground(summary):
        return f"{line} against the ground state, the lowest level the run's sector holds"
    where = f"sector {summary['sector']}" if summary.get("sector") else "the sectors its symmetry allows"
    return (f"{line} against the ground state ({summary['exact_energy']:.8f}), {in_sector:.2e} against the lowest "
            f"level of {where} ({summary['sector_exact_energy']:.8f})")


def log_warnings(summary: dict):
    """Each of the summary's health warnings as one log line."""
    for warning in summary.get("warnings", []):
        log.warning("health warning [%s]: %s", warning["name"], warning["message"])
