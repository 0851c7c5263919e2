"""The lowest states (task=excited): the K-state determinant trained by the ordinary loop on K copies
of the system, then the final estimate of the levels from the local energy matrix of fresh samples
(jackknife error bars over the chains), against the K lowest exact levels where the space allows."""

import dataclasses
import functools
import json
import logging
import time
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from runner.config.build import instantiate
from runner.config.task import Excited
from runner.core import excited
from runner.core.estimate import Rounds, burn_in, final_burn_in, scan_rounds
from runner.core.local_energy import map_over_samples
from runner.core.stats import statistics
from runner.core.wavefunction import apply_model
from runner.diagnostics import sectors
from runner.errors import ConfigError
from runner.lifecycle import ground_state, loop, programs, rundir, sector_check
from runner.lifecycle.finish import write_files as finish_files
from runner.lifecycle.load import Trained
from runner.outputs.summary import Outcome, Timings, finite, relative_error, report, summarise, v_score
from runner.parallel import distributed, mesh
from runner.physics import spectrum, symmetry
from runner.physics.exact import wants_exact

log = logging.getLogger(__name__)


def measured_invariance(experiment, state):
    """(rows of the space group under which each state's log psi is invariant, its spin-flip parity
    or None), measured on the first state at `state`'s parameters over the chains' configurations
    (`runner.lifecycle.sector_check.measured_eigenvalues`; a collective); None on a space without a
    space group. What the model's weight sharing (or a projection) keeps it in, so the exact levels
    it can reach are those of that space."""
    hilbert = experiment.hilbert
    if hilbert.space_group is None:
        return None
    group = symmetry.space_group(hilbert)
    each = _each_fn(experiment.problem.model)

    def first(params, sigma):
        return each(params, sigma)[..., 0]

    c_E, flip = sector_check.measured_eigenvalues(experiment, state, group, first)
    rows = group.perm_ExN[[e for e, c in enumerate(c_E) if c is not None and abs(c - 1) <= sectors.EIGEN_RTOL]]
    return rows, None if flip is None else round(flip.real)


def exact_levels(experiment, invariance=None) -> list | None:
    """The K lowest exact levels of the model's space: its sector, when the model projects onto
    one; else the states with the model's measured `invariance` ((rows, parity) of
    `measured_invariance`; None: the whole space). On process 0 where `exact` asks for them (auto:
    at most 2^20 states); None otherwise."""
    settings = experiment.settings
    if not (wants_exact(settings.exact, experiment.hilbert) and distributed.is_main()):
        return None
    t = time.perf_counter()
    n_states, where = settings.task.n_states, "the space"
    if experiment.sector is not None:
        found, where = spectrum.lowest_levels_in(experiment.hamiltonian, experiment.hilbert, n_states,
                                                 experiment.sector), f"sector {experiment.sector.name}"
    elif invariance is not None and (len(invariance[0]) > 1 or invariance[1] is not None):
        rows, parity = invariance
        found = spectrum.invariant_levels(experiment.hamiltonian, experiment.hilbert, n_states, rows, parity)
        where = (f"the states invariant under the model's {len(np.unique(rows, axis=0))} symmetries"
                 + ("" if parity is None else f", spin-flip parity {parity:+d}"))
    else:
        found = spectrum.lowest_levels_in(experiment.hamiltonian, experiment.hilbert, n_states)
    log.info("exact lowest levels of %s: %s (computed in %.1f s)", where, ", ".join(f"{e:.10f}" for e in found),
             time.perf_counter() - t)
    if len(found) < n_states:
        log.warning("%s holds %d states, fewer than task.n_states=%d: the levels above them are not exact "
                    "eigenvalues of this model's space", where, len(found), n_states)
    return found


def _each_fn(model):
    """(params, sigma [..., N]) -> log psi of every state [..., K] of a `models.determinant.Determinant`."""
    return lambda params, sigma_xN: apply_model(model, params, sigma_xN, method="each")


def final_matrices(experiment, state, n_rounds: int, sweeps: int):
    """(chains, (M(x) [C, R T, K, K], trace metrics)) at `state`'s parameters: `n_rounds` rounds of
    fresh samples after `sweeps` sweeps of burn-in, each chain's rounds one longer chain
    (`runner.core.estimate.scan_rounds`); the trace of M(x), the determinant's local energy under
    sum_j H_j, summarised like a ground-state run's."""
    return scan_rounds(experiment.problem, matrix_rounds(experiment), burn_in(experiment.problem, state, sweeps),
                       n_rounds)


def matrix_rounds(experiment) -> Rounds:
    """The levels' `Rounds`: each round's local matrices of H and of each observable, pooled into
    one longer chain per chain, with the trace's metrics."""
    problem, n_states = experiment.problem, experiment.settings.task.n_states
    operators = (experiment.hamiltonian, *observed_operators(experiment.observables))
    in_sector = experiment.observables is not None and experiment.observables.sector

    def one(params, sigma_CxTxM, carry):  # of H, then of each observable (dropping moves out of a fixed Sz, as H has none)
        def matrices(sigma):
            return tuple(excited.local_matrices(op, _each_fn(problem.model), params, sigma, n_states,
                                                conserve_sz=in_sector and k > 0)
                         for k, op in enumerate(operators))

        return carry, map_over_samples(matrices, sigma_CxTxM, problem.chunk_per_chain)

    def pool(carry, m_RxCxTxKxK, acceptance_R):
        pooled = tuple(jnp.moveaxis(m, 0, 1).reshape(m.shape[1], -1, n_states, n_states) for m in m_RxCxTxKxK)
        stats = statistics(jnp.trace(pooled[0], axis1=-2, axis2=-1))
        trace = {"energy": jnp.real(stats.mean), "energy_imag": jnp.imag(stats.mean),
                 "energy_error": stats.error_of_mean, "variance": stats.variance, "r_hat": stats.r_hat,
                 "tau_corr": stats.tau_corr, "acceptance": jnp.mean(acceptance_R)}
        return pooled, trace

    return Rounds(start=lambda chains: (), one=one, pool=pool)


def observed_operators(obs) -> tuple:
    """The Pauli sums measured in each state: the observables' (as simulated, rotated like H); S(q)
    is not measured per state."""
    return () if obs is None else tuple(obs.simulated)


def final_estimate(experiment, state, shardings, layout, sweeps: int) -> tuple[dict, dict]:
    """(the trace's metrics, the levels' fields `level_fields`) at `state`'s parameters."""
    fn = functools.partial(final_matrices, experiment, n_rounds=experiment.settings.final_rounds, sweeps=sweeps)
    with mesh.activate(layout):
        lowered = jax.jit(lambda s: fn(s)[1], in_shardings=(shardings,),
                          out_shardings=(layout.replicated, layout.replicated)).lower(state)
    compiled = programs.compiled(lowered, layout)
    matrices, trace = mesh.to_host(compiled(state))
    fields = level_fields(np.asarray(matrices[0]), experiment.hilbert.n_sites)
    if experiment.observables is not None:
        for name, o_CxSxKxK in zip(experiment.observables.names, matrices[1:]):
            values, errors = excited.state_expectations(matrices[0], o_CxSxKxK)
            for level, value, error in zip(fields["states"], values, errors):
                level.setdefault("observables", {}).update({name: finite(value), f"{name}_error": finite(error)})
    return {k: finite(v) for k, v in trace.items()}, fields


def level_fields(m_CxSxKxK, n_sites: int, exact: list | None = None) -> dict:
    """summary.json's `states` (ascending: energy, energy_error, variance, v_score) and `gaps`
    (E_k - E_0, gap_error: a jackknife over chains of the same samples' levels) from local
    matrices, with `exact_levels` and relative errors where `exact` gives them."""
    found = excited.levels(m_CxSxKxK)
    variances = excited.state_variances(m_CxSxKxK)
    coefficients = excited.eigenstate_coefficients(m_CxSxKxK)
    states = [{"energy": finite(e), "energy_error": finite(err), "variance": finite(var),
               "v_score": finite(v_score(n_sites, e, var) or np.nan),
               "coefficients": [[float(c.real), float(c.imag)] for c in row]}
              for e, err, var, row in zip(found.energies, found.energy_errors, variances, coefficients)]
    gaps = [{"gap": finite(g), "gap_error": finite(err)} for g, err in zip(found.gaps, found.gap_errors)]
    return with_exact({"states": states, "gaps": gaps}, exact)


def with_exact(fields: dict, exact: list | None) -> dict:
    """`level_fields`' fields with the exact levels (`exact_levels`; None: not computed) and each
    state's and gap's relative error."""
    out = {"states": [dict(s) for s in fields["states"]], "gaps": [dict(g) for g in fields["gaps"]],
           "exact_levels": exact}
    if exact is None:
        return out
    for state, level in zip(out["states"], exact):
        state.update(exact_energy=level, relative_error=relative_error(state["energy"], level))
    for k, gap in enumerate(out["gaps"], start=1):
        exact_gap = exact[k] - exact[0]
        gap.update(exact_gap=exact_gap, relative_error=relative_error(gap["gap"], exact_gap))
    return out


OFF_BY = 3.0  # error bars: a level or gap further than this from its exact value is not converged
DRIFT_SIGMAS = 3.0  # standard errors: a trace falling by more over the last tenth of the run is still converging


def drift_of_last_tenth(records: list[dict]) -> tuple[float, float] | None:
    """(drift, its standard error) of the trace's energy over the last tenth of the steps (at least 10):
    the mean of that tenth's second half minus its first half's, the error from the steps' scatter."""
    energies = np.array([r["energy"] for r in records if isinstance(r.get("energy"), (int, float))], float)
    energies = energies[np.isfinite(energies)]
    tenth = max(len(energies) // 10, 10)
    if len(energies) < tenth or tenth < 4:
        return None
    first, second = np.array_split(energies[-tenth:], 2)
    error = np.sqrt(first.var(ddof=1) / len(first) + second.var(ddof=1) / len(second))
    return float(second.mean() - first.mean()), float(error)


def convergence_warning(result: dict, records: list[dict]) -> dict | None:
    """One `excited_unconverged` warning ({name, message}) for summary.json's warnings and the log, or
    None: the levels and gaps more than OFF_BY error bars from their exact values (where known), and
    the trace (the sum of the levels) still falling over the last tenth of the run (a drift of more
    than DRIFT_SIGMAS standard errors)."""
    off = []
    for k, state in enumerate(result.get("states", [])):
        exact, e, err = state.get("exact_energy"), state.get("energy"), state.get("energy_error")
        if None not in (exact, e, err) and abs(e - exact) > OFF_BY * err:
            off.append(f"E_{k} {e:.6f} ± {err:.1e} against exact {exact:.6f} ({abs(e - exact) / err:.0f} error bars)")
    for k, gap in enumerate(result.get("gaps", []), start=1):
        exact, g, err = gap.get("exact_gap"), gap.get("gap"), gap.get("gap_error")
        if None not in (exact, g, err) and abs(g - exact) > OFF_BY * err:
            off.append(f"E_{k} - E_0 {g:.6f} ± {err:.1e} against exact {exact:.6f} "
                       f"({abs(g - exact) / err:.0f} error bars)")
    drift = drift_of_last_tenth(records)
    if drift is not None and drift[0] < -DRIFT_SIGMAS * drift[1]:
        off.append(f"the sum of the levels still falls over the last tenth of the run ({drift[0]:.2e} ± {drift[1]:.1e})")
    if not off:
        return None
    return {"name": "excited_unconverged",
            "message": "the levels are not converged: " + "; ".join(off) + " (more steps: n_iter, or a larger "
                       "learning rate; docs/excited.md)"}


def _shown(value, spec: str) -> str:
    return "nan" if value is None else format(value, spec)


class Context(NamedTuple):
    """What an excited-state run keeps from its init for its finish."""

    exact: list | None  # the exact lowest levels (`exact_levels`), or None
    n_params: int


def init(experiment, layout, run_dir, resuming: bool, sweep_dir=None) -> loop.Begun:
    """The fresh or resumed state of the K states, then the exact levels of the space the model can
    reach (measured on that state where the model has no sector)."""
    state, shardings, n_params, done = ground_state.start(experiment, layout, run_dir, resuming)
    exact = None
    if wants_exact(experiment.settings.exact, experiment.hilbert):
        invariance = None if experiment.sector is not None else measured_invariance(experiment, state)
        exact = exact_levels(experiment, invariance)
    return ground_state.begun(experiment, state, shardings, done, Context(exact, n_params))


def finish(experiment, layout, run_dir, ended: loop.Ended) -> loop.Finished:
    """After a completed training the levels' final estimate; the summary (the trace of the local
    energy matrix as the energy, each state and gap against the exact levels) and energy.png."""
    settings, exact = experiment.settings, ended.begun.context.exact
    trace, levels = {}, {"states": [], "gaps": []}
    if ended.status == "completed":
        trace, levels = final_estimate(experiment, ended.state, ended.begun.shardings, layout,
                                       final_burn_in(experiment.problem.sampler))
    exact_sum = None if exact is None else float(sum(exact))
    compile_seconds = ended.program.compile_seconds if ended.program is not None else None
    timings = Timings.of(ended.step_times, compile_seconds, time.perf_counter() - ended.started)
    outcome = Outcome(status=ended.status, reason=ended.reason, final=trace, exact_energy=exact_sum,
                      n_params=ended.begun.context.n_params, timings=timings)
    result = {"task": "excited", "n_states": settings.task.n_states,
              **summarise(experiment, layout, outcome, ended.records), **with_exact(levels, exact)}
    if ended.status == "completed":
        warning = convergence_warning(result, ended.records)
        if warning is not None:
            result["warnings"] = [*result.get("warnings", []), warning]
    report(result)
    lines = [f"state {k}: {_shown(level['energy'], '.10f')} ± {_shown(level['energy_error'], '.2e')}  "
             f"(variance {_shown(level['variance'], '.2e')})" + ("" if exact is None else f"  exact {exact[k]:.10f}")
             for k, level in enumerate(result["states"])]
    lines += [f"gap E_{k} - E_0: {_shown(gap['gap'], '.10f')} ± {_shown(gap['gap_error'], '.2e')}"
              + ("" if gap.get("exact_gap") is None else f"  exact {gap['exact_gap']:.10f}")
              for k, gap in enumerate(result["gaps"], start=1)]
    return loop.Finished(result, lambda run_dir: finish_files(run_dir, result, ended.records, exact_sum, None),
                         tuple(lines))


TASK = loop.Task("excited", init, ground_state.compile, ground_state.record, finish, ground_state.holds)


def state_of(trained: Trained, k: int) -> Trained:
    """Eigenstate k of an excited-state run (the level summary.json's `states[k]` reports) as a run
    on the model's own space, Hamiltonian and sampler: psi_k = sum_j c_kj psi_j, the combination of
    the K trained states with the coefficients of the final estimate (`states[k].coefficients`,
    `runner.core.excited.eigenstate_coefficients`), a `runner.core.excited.Combination` of the
    run's determinant (its parameters, all K states'), sampled from |psi_k|^2 starting from the
    chains' k-th copy.

    Raises:
        ConfigError: not a task=excited run, k out of range, or a summary without the coefficients
            (a run that did not complete, or one written before they were stored).
    """
    experiment = trained.experiment
    task = experiment.settings.task
    if not isinstance(task, Excited):
        raise ConfigError("task", f"{trained.run_dir} is not a task=excited run; it has one state")
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < task.n_states:
        raise ConfigError("state", f"must be an integer from 0 to {task.n_states - 1} (got {k!r})")
    path = Path(trained.run_dir) / rundir.SUMMARY
    states = json.loads(path.read_text()).get("states") if path.is_file() else None
    if not states or len(states) != task.n_states or "coefficients" not in states[k]:
        raise ConfigError("state", f"{path} holds no eigenstate coefficients (a run that did not complete, or one "
                          "from before they were stored): rerun it to completion (same directory, it resumes)")
    coefficients = tuple(complex(re, im) for re, im in states[k]["coefficients"])
    n = experiment.hilbert.n_sites
    determinant = experiment.problem.model
    model = excited.Combination(base=determinant.base, n_states=determinant.n_states, coefficients=coefficients)
    sampler = instantiate("sampler", trained.config["sampler"], hilbert=experiment.hilbert)
    problem = dataclasses.replace(experiment.problem, model=model, hamiltonian=experiment.hamiltonian, sampler=sampler)
    settings = dataclasses.replace(experiment.settings, task=None)  # the ground-state task: one state
    chains = trained.state.chains._replace(sigma_CxN=trained.state.chains.sigma_CxN[:, k * n:(k + 1) * n])
    return dataclasses.replace(trained, experiment=dataclasses.replace(experiment, problem=problem, settings=settings),
                               state=trained.state._replace(chains=chains))
