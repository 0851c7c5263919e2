"""What a run does besides training: the exact energy (shared through a sweep's cache), the final
estimate (also `runner.evaluate`'s), the peak check, and the files it leaves."""

import functools
import json
import logging
import time
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp

from runner.core import observe
from runner.core.estimate import (
    Rounds,
    burn_in,
    burn_in_sweeps,
    draws_estimate_samples,
    energy_rounds,
    estimate,
    final_burn_in,
    reduce_rounds,
)
from runner.diagnostics import peaks
from runner.lifecycle import programs, rundir, sweep_cache
from runner.outputs.plot import plot_energy
from runner.outputs.summary import finite
from runner.parallel import distributed, mesh
from runner.physics import observables
from runner.physics.exact import ground_state, wants_exact

log = logging.getLogger(__name__)

EXACT_KEYS = ("hilbert.", "hamiltonian.")  # the config the exact ground energy depends on
EXACT_FIELDS = ("exact_observables",)  # summary fields of the exact ground state's observables


class Exact(NamedTuple):
    """The exact ground state's numbers a run reports: its energy, and with observables their
    values in the ground vector (`runner.physics.observables.exact_values`: summary fields,
    correlations.json fields); None where not computed."""

    energy: float | None = None
    observed: tuple | None = None


def exact_energy(experiment, sweep_dir: Path | None) -> float | None:
    """The exact ground energy when the `exact` knob asks for it, else None (`exact_ground`)."""
    return exact_ground(experiment, sweep_dir).energy


def exact_ground(experiment, sweep_dir: Path | None) -> Exact:
    """The exact ground energy, and the observables in the ground vector of the same Lanczos run
    when the run measures observables, when the `exact` knob asks for them.

    Computed on process 0 only; the energy is broadcast to the others. In a sweep (`sweep_dir`),
    process 0 first looks in SWEEP_DIR/.exact_cache for the values of the same lattice and
    Hamiltonian (and observables) computed by an earlier point, and stores what it computes there.
    """
    settings, obs = experiment.settings, experiment.observables
    if not wants_exact(settings.exact, experiment.hilbert):
        return Exact()
    energy, observed = 0.0, None
    if distributed.is_main():
        prefixes = EXACT_KEYS + (("observables.",) if obs is not None else ())
        key = {k: v for k, v in settings.fingerprint.items() if k.startswith(prefixes)}
        cache = sweep_dir / rundir.EXACT_CACHE if sweep_dir is not None else None
        cached = sweep_cache.read(cache, key) if cache is not None else None
        if isinstance(cached, dict) and "energy" in cached and (obs is None or "summary" in cached):
            energy = float(cached["energy"])
            observed = None if obs is None else (cached["summary"], cached["correlations"])
        else:
            cached = None
            t = time.perf_counter()
            energy, psi_D = ground_state(experiment.hamiltonian, experiment.hilbert, vector=obs is not None)
            if obs is not None:
                observed = observables.exact_values(obs, experiment.hilbert, psi_D)
            log.info("exact ground energy %.10f (computed in %.1f s)", energy, time.perf_counter() - t)
            if cache is not None:
                sweep_cache.write(cache, key, {"energy": energy} if obs is None else
                                  {"energy": energy, "summary": observed[0], "correlations": observed[1]})
        if cached is not None:
            log.info("exact ground energy %.10f (from the sweep cache %s)", energy, sweep_cache.path(cache, key))
    if distributed.process_count() > 1:
        energy = distributed.broadcast_float(energy)
    return Exact(energy, observed)


def compile_final_estimate(experiment, state, shardings, layout, sweeps: int):
    """The final estimate's function (`final_estimate`) in one program, compiled for states shaped
    and placed like `state`: state -> (chains, energy metrics, or (energy metrics, measured) with
    observables)."""
    problem, settings, obs = experiment.problem, experiment.settings, experiment.observables
    if obs is None:
        fn = functools.partial(estimate, problem, n_rounds=settings.final_rounds)
    else:  # the energy and the observables from the same samples
        fn = functools.partial(observe.estimate, problem, obs, n_rounds=settings.final_rounds)
    lowered = jax.jit(lambda s: fn(burn_in(problem, s, sweeps)), in_shardings=(shardings,),
                      out_shardings=(shardings.chains, layout.replicated)).lower(state)
    return programs.compiled(lowered, layout)


def estimate_rounds(experiment) -> Rounds:
    """The final estimate's rounds: the energy's, or the energy's and the observables'."""
    obs = experiment.observables
    return energy_rounds(experiment.problem) if obs is None else observe.observed_rounds(experiment.problem, obs)


def rounds_on(draw, rounds: Rounds, state, n_rounds: int, layout):
    """(chains, estimate): what `scan_rounds` computes in one program, with each round's samples
    drawn by `draw`, a training step's compiled sampling ((params, chains) -> (chains,
    sigma_CxTxN, None, acceptance)), so that no sampler is compiled again; the rounds' values are
    then computed in one program (`reduce_rounds`)."""
    chains, samples = state.chains, []
    for _ in range(n_rounds):
        chains, sigma_CxTxN, _, accepted = draw(state.params, chains)
        samples.append((sigma_CxTxN, accepted))

    def reduce(params, chains, samples):
        return reduce_rounds(rounds, params, chains, *jax.tree_util.tree_map(lambda *x: jnp.stack(x), *samples))

    return chains, jax.jit(reduce, out_shardings=layout.replicated)(state.params, state.chains, samples)


def final_estimate(experiment, state, shardings, layout, sweeps: int, draw=None):
    """THE final estimate: the energy (and the observables, from the same fresh samples) at
    `state`'s parameters, after `sweeps` sweeps of burn-in (`runner.core.vmc.burn_in`).

    Args:
        experiment: the run's `runner.config.build.Experiment` (its `final_rounds` rounds of
            `sampler.n_samples`).
        state: the VMC state, placed by `shardings` on `layout`.
        sweeps: a run's own `runner.core.vmc.final_burn_in`, or an evaluation's choice.
        draw: the training step's compiled sampling (`runner.lifecycle.ground_state.CompiledStep.draw`)
            or None. Where it draws the estimate's rounds (`draws_estimate_samples`, no burn-in)
            the rounds run on it (`rounds_on`), else the whole estimate is one program
            (`compile_final_estimate`): the same numbers either way (tests/lifecycle/test_finish.py).

    Returns:
        (energy metrics, non-finite values None; with observables (summary fields,
        correlations.json), else None).
    """
    problem, settings, obs = experiment.problem, experiment.settings, experiment.observables
    if draw is not None and draws_estimate_samples(problem) and burn_in_sweeps(problem.sampler, sweeps) == 0:
        out = mesh.to_host(rounds_on(draw, estimate_rounds(experiment), state, settings.final_rounds, layout)[1])
    else:
        out = mesh.to_host(compile_final_estimate(experiment, state, shardings, layout, sweeps)(state)[1])
    if obs is None:
        return {k: finite(v) for k, v in out.items()}, None
    energy, measured = out
    n_per_chain = settings.final_rounds * problem.sampler.n_samples // problem.sampler.n_chains
    return {k: finite(v) for k, v in energy.items()}, observables.results(obs, measured, n_per_chain)


def peak_check(problem, settings, state, final: dict) -> dict | None:
    """`runner.diagnostics.peaks.check` at the final parameters, from the chains' last configurations and
    `peak_search` uniform ones; None after a full sum (no sample to miss anything) or with
    peak_search=0. Every process runs the same search on its own default device."""
    if final.get("log_abs_max") is None or settings.peak_search == 0:  # before the collective below
        return None
    params, sigma_CxN = mesh.to_host((state.params, state.chains.sigma_CxN))  # a collective
    result = peaks.check_estimate(problem, params, final, sigma_CxN, settings.peak_search, settings.seed)
    log.info("peak search (%s): largest |psi|^2 found e^%.1f times the samples' largest", result["method"],
             result["log_ratio"])
    return result


def conclude(experiment, layout, state, shardings, draw=None, exact: Exact = Exact()):
    """After a completed training (its last checkpoint saved): the final estimate and the peak check
    at `state` (`draw`: the training step's compiled sampling, `final_estimate`).

    Returns:
        (final energy metrics, with observables (summary fields, correlations.json; with
        `exact.observed` its fields too) or None, peak check).
    """
    problem, settings = experiment.problem, experiment.settings
    final, observed = final_estimate(experiment, state, shardings, layout, final_burn_in(problem.sampler), draw)
    for name, value in (observed[0]["observables"] if observed else {}).items():
        if value["mean"] is not None:
            log.info("%s: %.8f ± %.2e", name, value["mean"], float("nan") if value["error"] is None else value["error"])
    if observed is not None and exact.observed is not None:  # on process 0 only
        observed = ({**observed[0], **exact.observed[0]}, {**observed[1], **exact.observed[1]})
    return final, observed, peak_check(problem, settings, state, final)


def write_files(run_dir: Path, summary: dict, records: list[dict], exact: float | None, correlations: dict | None):
    """energy.png and (with observables) correlations.json, by process 0 (summary.json is the loop's:
    `runner.lifecycle.loop.write_summary`)."""
    if not distributed.is_main():
        return
    plot_energy(records, exact, run_dir / rundir.ENERGY_PLOT, n_sites=summary.get("n_sites"),
                unit=summary.get("energy_unit"))
    if correlations is not None:
        (run_dir / rundir.CORRELATIONS).write_text(json.dumps(correlations) + "\n")
