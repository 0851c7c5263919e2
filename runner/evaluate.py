"""`python -m runner.evaluate RUN_DIR [overrides]`: energy, variance, V-score and observables of a run's checkpoint from fresh samples."""

import json
import logging
import sys
import time
from pathlib import Path

import jax
import numpy as np

from runner.config import compose, fingerprint, monte_carlo
from runner.config.build import instantiate
from runner.core.estimate import BURN_IN_SWEEPS, burn_in_sweeps, final_burn_in
from runner.core.sampler import init_chains
from runner.core.vmc import full_sum_invariance_error
from runner.diagnostics import health, peaks
from runner.errors import ConfigError
from runner.config.task import Excited
from runner.lifecycle import checkpoint, excited, load, rundir
from runner.lifecycle.finish import final_estimate
from runner.outputs.summary import estimate_fields
from runner.parallel import distributed, mesh
from runner.parallel.distributed import DistributedInitError
from runner.parallel.runtime import configure_runtime

log = logging.getLogger(__name__)

# The model key an evaluation may change: the symmetry sector the trained parameters are projected
# onto (the same parameters, a state in that sector: its energy is as variational).
PROJECTION_KEY = "model.sector"
USAGE = "usage: python -m runner.evaluate RUN_DIR [overrides, e.g. sampler.n_samples=65536 final_rounds=4 parallel=sharded]"


def compose_config(run_dir, overrides) -> dict:
    """The run's config with `overrides` applied after the run's own, as Hydra composes them
    (`runner.config.compose.compose`: each override checked against that composition).

    The run's own record (.hydra/config.yaml) is the base; a top-level key or group is taken
    from the composition only where the overrides change it (so a conf/ edited since the run
    does not leak in). A run whose recipe has a Monte Carlo set-up (`runner.config.monte_carlo`) is compared and
    changed as it ran: each `key=value` also sets the set-up's key.

    Raises:
        ConfigError: an override refused or that Hydra cannot compose, or one that changes the Hamiltonian,
            model (other than its sector, `PROJECTION_KEY`), lattice or dtype (naming the key
            and both values).
    """
    from omegaconf import OmegaConf

    raw = load.read_config(run_dir)
    run_overrides = load.read_overrides(run_dir)
    if raw.get(monte_carlo.KEY) is not None:  # the overrides change what the run ran: its set-up's keys too
        groups = compose.composed(before=run_overrides)[1]
        overrides = [*overrides, *(f"++{monte_carlo.KEY}.{o}" for o in map(str, overrides)
                                   if "=" in o and o.partition("=")[0] not in groups and o[0] not in "+~")]
    stored = monte_carlo.resolve(raw, instantiate)
    base = OmegaConf.to_container(compose.compose(before=run_overrides), resolve=True)
    new = OmegaConf.to_container(compose.compose(overrides, before=run_overrides), resolve=True)
    base, new = monte_carlo.resolve(base, instantiate), monte_carlo.resolve(new, instantiate)
    config = dict(stored)
    for key in new:
        if base.get(key) != new[key]:
            config[key] = new[key]
    unprojected = lambda c: {k: v for k, v in fingerprint.of(c).items()  # noqa: E731
                             if k != PROJECTION_KEY and not k.startswith(PROJECTION_KEY + ".")}
    load.refuse_difference(
        unprojected(stored), unprojected(config), load.PHYSICS_KEYS, f"the run {run_dir}",
        "an evaluation measures the run's own state (its Hamiltonian, model, lattice and dtype; "
        "model.sector may project it)",
        here="the overrides",
    )
    return config


def split_total(config: dict, overrides) -> dict:
    """`config` with a `sampler.n_samples=TOTAL` override read as the total an evaluation draws:
    `final_rounds` rounds of TOTAL / final_rounds each (without that override, the run's
    rounds of its own n_samples).

    Raises:
        ConfigError: TOTAL is not a multiple of final_rounds.
    """
    if not any(o.startswith("sampler.n_samples=") for o in overrides):
        return config
    total, rounds = config["sampler"]["n_samples"], config["final_rounds"]
    if not isinstance(total, int) or not isinstance(rounds, int) or rounds < 1 or total % rounds:
        raise ConfigError("sampler.n_samples", f"is the total an evaluation draws in final_rounds={rounds} rounds "
                          f"and must be a multiple of it (got {total})")
    return {**config, "sampler": {**config["sampler"], "n_samples": total // rounds}}


def projection_change(stored: dict, config: dict) -> dict | None:
    """{"model.sector": [the run's value, the evaluated one]} when an evaluation changes the
    sector, or None when it evaluates the trained state itself (a run written before the key
    existed had no projection: null)."""
    old, new = (c["model"].get("sector") for c in (stored, config))
    return None if old == new else {PROJECTION_KEY: [old, new]}


def _set_up(run_dir: Path, overrides):
    """(config, experiment, layout, trained run): the run's config with the overrides, the
    processes and mesh it asks for, and the run's checkpoint (refused when a full sum over
    orbits does not fit the trained parameters)."""
    config = split_total(compose_config(run_dir, list(overrides)), list(overrides))
    experiment = load.experiment_of(config)
    distributed.initialize(experiment.parallel, experiment.x64)
    layout = mesh.make_mesh(experiment.parallel["backend"])
    mesh.check_chains(experiment.problem.sampler.n_chains, layout)
    trained = load.load(run_dir)
    error = full_sum_invariance_error(experiment.problem, [trained.state.params])
    if error is not None:
        raise ConfigError("sampler.symmetry", error)
    return config, experiment, layout, trained


def _chains(experiment, trained: load.Trained, projection):
    """(state, continued, burn-in sweeps): the checkpoint's chains when the number of chains and the
    seed are the run's, otherwise fresh ones from `seed`; the run's own burn-in when the chains still
    sample what they did, a full one (`BURN_IN_SWEEPS`) for fresh chains or a projected model."""
    sampler, seed = experiment.problem.sampler, experiment.settings.seed
    run_sampler = trained.experiment.problem.sampler
    continued = sampler.n_chains == run_sampler.n_chains and seed == trained.experiment.settings.seed
    state = trained.state
    if not continued:
        state = state._replace(chains=jax.tree_util.tree_map(np.asarray, init_chains(sampler, seed)))
    sweeps = burn_in_sweeps(sampler, final_burn_in(run_sampler) if continued and projection is None else BURN_IN_SWEEPS)
    return state, continued, sweeps


def evaluate(run_dir, overrides=()) -> dict:
    """Estimates energy, variance, V-score (and with `observables=...`, observables) at a run's
    checkpointed parameters, and looks for configurations with more |psi|^2 than every sample
    (`runner.diagnostics.peaks`).

    Samples `final_rounds` rounds of the run's `sampler.n_samples` with the (overridden) sampler
    on the (overridden) parallel backend; an override `sampler.n_samples=TOTAL` is the total,
    split into `final_rounds` rounds (`split_total`). The checkpoint's chains are continued when the number of
    chains and the seed are the run's (with the run's own settings this reproduces its final
    estimate exactly, its burn-in included: `runner.lifecycle.finish.final_estimate`); otherwise fresh
    chains start from `seed`. Fresh chains, and the run's chains under a projected model, first
    discard `runner.core.vmc.BURN_IN_SWEEPS` sweeps ("burn_in_sweeps" in the result).

    Args:
        run_dir: a run directory (with .hydra/ and checkpoint/).
        overrides: Hydra overrides (sampler, final_rounds, seed, chunk_size, parallel, observables,
            peak_search; model.sector evaluates the trained parameters' projection on a symmetry
            sector, "projection" in the result).

    Returns:
        The evaluation dict, also written to RUN_DIR/evaluation.json by process 0.

    Raises:
        ConfigError: a bad override or run directory.
    """
    started = time.perf_counter()
    run_dir = Path(run_dir)
    config, experiment, layout, trained = _set_up(run_dir, overrides)
    problem, settings = experiment.problem, experiment.settings
    projection = projection_change(trained.config, config)
    state, continued, sweeps = _chains(experiment, trained, projection)
    n, rounds, chains = problem.sampler.n_samples, settings.final_rounds, problem.sampler.n_chains
    log.info("evaluating with %d samples (%d rounds of %d over %d chains)", n * rounds, rounds, n, chains)
    summary_path = run_dir / rundir.SUMMARY
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    metrics, measured, peak_check = _estimate(experiment, state, layout, sweeps, summary)
    result = {
        **estimate_fields(experiment.hilbert.n_sites, metrics, summary.get("exact_energy")),
        "step": int(trained.meta["step"]), "t": trained.meta.get("t"),  # t: a dynamics run's last saved time
        "n_samples": problem.sampler.n_samples,
        "final_rounds": settings.final_rounds,
        "total_samples": problem.sampler.n_samples * settings.final_rounds,
        "n_chains": problem.sampler.n_chains,
        "chains": "checkpoint" if continued else f"fresh (seed {settings.seed})",
        "backend": experiment.parallel["backend"],
        "processes": distributed.process_count(),
        "devices": layout.n_devices,
        "overrides": list(overrides),
        "projection": projection,
        "burn_in_sweeps": sweeps,
        "peak_check": peak_check,  # runner.diagnostics.peaks.check (None after a full sum or with peak_search=0)
        **measured,  # observables {name: {mean, error}} (and structure_factor_q); task=excited: states, gaps
        "config_fingerprint": trained.meta.get("config_fingerprint"),
        "wall_seconds": time.perf_counter() - started,
    }
    _write(run_dir, result)
    return result


def _estimate(experiment, state, layout, sweeps: int, summary: dict):
    """(energy metrics, the fields measured beside them, peak check) at the checkpoint's state:
    for task=excited the levels (`runner.lifecycle.excited.final_estimate`, against the run's
    exact levels; no peak search), else the energy and observables and the peak check."""
    shardings = mesh.shard_state(state, layout)
    placed = mesh.from_host(state, shardings)
    if isinstance(experiment.settings.task, Excited):
        metrics, levels = excited.final_estimate(experiment, placed, shardings, layout, sweeps)
        return metrics, excited.with_exact(levels, summary.get("exact_levels")), None
    metrics, observed = final_estimate(experiment, placed, shardings, layout, sweeps)
    settings = experiment.settings
    peak_check = peaks.check_estimate(experiment.problem, state.params, metrics, state.chains.sigma_CxN,
                                      settings.peak_search, settings.seed)
    return metrics, (observed[0] if observed else {}), peak_check


def _write(run_dir: Path, result: dict):
    """Process 0 writes RUN_DIR/evaluation.json atomically."""
    if distributed.is_main():
        text = json.dumps(result, indent=2) + "\n"
        checkpoint.write_atomic(run_dir / rundir.EVALUATION, lambda f: f.write(text.encode()))


def main(argv=None):
    """The command line: one sentence and status 2 for a bad run directory or override."""
    configure_runtime()
    argv = sys.argv[1:] if argv is None else list(argv)
    # a sweep's run directories have "=" in their names: only a path that is not one is an override
    if not argv or argv[0].startswith("-") or ("=" in argv[0] and not Path(argv[0]).is_dir()):
        print(USAGE, file=sys.stderr)
        sys.exit(2)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)
    try:
        result = evaluate(argv[0], argv[1:])
    except ConfigError as err:
        print(f"Config error: {err.sentence()}", file=sys.stderr)
        sys.exit(2)
    except DistributedInitError as err:
        print(err, file=sys.stderr)
        sys.exit(1)
    at = f"step {result['step']}" if result["t"] is None else f"t = {result['t']:g}"
    lines = [f"energy: {result['energy']:.10f} ± {result['energy_error']:.2e}  (V-score {result['v_score']:.2e}, "
             f"{result['total_samples']} samples at {at}, chains: {result['chains']})"]
    if result["relative_error"] is not None:
        lines.append(f"relative error: {result['relative_error']:.2e} (exact {result['exact_energy']:.10f})")
    for k, level in enumerate(result.get("states", [])):  # task=excited
        lines.append(f"state {k}: {level['energy']:.10f} ± {level['energy_error']:.2e}")
    for name, value in result.get("observables", {}).items():
        if value["mean"] is not None:
            lines.append(f"{name}: {value['mean']:.8f} ± {float('nan') if value['error'] is None else value['error']:.2e}")
    peak = result["peak_check"]
    if peak is not None:
        lines.append(f"peak search ({peak['method']}): largest |psi|^2 found e^{peak['log_ratio']:.1f} times the "
                     "samples' largest")
    lines.append(f"written to {Path(argv[0]) / rundir.EVALUATION}")
    for line in lines:
        log.info(line)
    warning = health.check_peaks(peak)
    if warning is not None:
        log.warning("warning %s: %s", *warning)


if __name__ == "__main__":
    main()
