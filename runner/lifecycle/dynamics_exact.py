"""The exact reference of a time evolution (task=dynamics): the exact dynamics from the run's own
initial state where the space can be enumerated, free fermions for a quench of a large periodic
Ising chain from a ground-state run, and the largest errors of a trajectory against them."""

import logging
import time

import jax
import jax.numpy as jnp
import numpy as np

from runner.config.task import GroundState
from runner.lifecycle import load
from runner.parallel import distributed
from runner.physics import dynamics as exact_dynamics
from runner.physics.exact import expectation, wants_exact
from runner.physics.hilbert import all_states

log = logging.getLogger(__name__)

EXACT_CHUNK = 2**14  # configurations per evaluation of the initial state for the exact dynamics


def initial_vector(problem, params, hilbert) -> np.ndarray:
    """psi(s) of the variational state at `params` on every configuration of the space [D]
    (normalised; in chunks of EXACT_CHUNK configurations)."""
    logpsi = jax.jit(problem.logpsi)
    states = all_states(hilbert)
    logpsi_D = np.concatenate([np.asarray(logpsi(params, jnp.asarray(states[i:i + EXACT_CHUNK])))
                               for i in range(0, len(states), EXACT_CHUNK)])
    psi_D = np.exp(logpsi_D - np.max(logpsi_D.real)).astype(np.complex128)
    return psi_D / np.linalg.norm(psi_D)


def exact_trajectory(experiment, params, times) -> dict | None:
    """{"t", "energy", "obs/<name>"} of the exact dynamics on `times`, on process 0, in real time:
    where `exact` allows it (auto: at most 2^20 states), from the run's own initial state (the
    variational state at `params`, enumerated: uniform for plus_x, the init_from run's state
    otherwise); past that, with exact: auto, by free fermions for a periodic Ising chain started
    from a ground-state run of the same chain at another field (`free_fermion_trajectory`);
    None otherwise."""
    settings, obs = experiment.settings, experiment.observables
    if not (settings.task.real_time and distributed.is_main()):
        return None
    if not wants_exact(settings.exact, experiment.hilbert):
        return free_fermion_trajectory(experiment, times) if settings.exact == "auto" else None
    started = time.perf_counter()
    psi0_D = initial_vector(experiment.problem, params, experiment.hilbert)
    psi_TxD = exact_dynamics.evolve(experiment.hamiltonian, experiment.hilbert, psi0_D, times)
    operators = {"energy": experiment.hamiltonian}
    if obs is not None:
        operators.update({f"obs/{name}": op for name, op in zip(obs.names, obs.simulated)})
    values = {name: expectation(op, experiment.hilbert, psi_TxD) for name, op in operators.items()}
    log.info("exact dynamics on %d times in %.1f s", len(times), time.perf_counter() - started)
    return {"t": [float(t) for t in times], **{k: [float(x) for x in v] for k, v in values.items()}}


def _source_hamiltonian(experiment):
    """The Hamiltonian of the init_from run when it was a ground-state run, else None."""
    src = experiment.settings.init_from
    if experiment.settings.task.initial_state != "init_from" or src is None:
        return None
    source = load.experiment_of(load.read_config(src.run_dir))
    return source.hamiltonian if isinstance(source.settings.task, GroundState) else None


def free_fermion_trajectory(experiment, times) -> dict | None:
    """{"t", "energy", "obs/<name>" for every observable c sum_i X_i, "initial_state"} of the
    periodic Ising chain (-J sum Z_i Z_i+1 - h1 sum X_i) started in the exact ground state at the
    field h0 of the init_from run's Hamiltonian (the same chain and J) -- the exact state, not the
    trained one -- by free fermions (`runner.physics.dynamics.ising_quench_magnetisation`); None
    when the run is not such a quench."""
    source = _source_hamiltonian(experiment)
    quench = exact_dynamics.ising_chain_couplings(experiment.hamiltonian)
    start = None if source is None else exact_dynamics.ising_chain_couplings(source)
    if quench is None or start is None or start[0] != quench[0] or source.n_sites != experiment.hilbert.n_sites:
        return None
    (J, h1), (_, h0), n = quench, start, experiment.hilbert.n_sites
    x_T = exact_dynamics.ising_quench_magnetisation(n, h0, h1, times, J=J)
    out = {"t": [float(t) for t in times], "energy": [exact_dynamics.ising_quench_energy(n, h0, h1, J)] * len(times)}
    obs = experiment.observables
    for name, op in zip(obs.names, obs.simulated) if obs is not None else ():
        c = exact_dynamics.uniform_x_coefficient(op)
        if c is not None:
            out[f"obs/{name}"] = [float(c * n * x) for x in x_T]
    log.info("exact dynamics by free fermions from the exact ground state at h = %g", h0)
    return {**out, "initial_state": f"the exact ground state at h = {h0!r} (free fermions), not the init_from run's"}


def max_abs_errors(records: list[dict], exact: dict | None) -> dict | None:
    """{quantity: max over the saved times reached of |ours - exact|}, or None without exact values."""
    if exact is None:
        return None
    out = {}
    for key in (k for k in exact if k == "energy" or k.startswith("obs/")):
        pairs = [(r.get(key), e) for r, e in zip(records, exact[key])]
        out[key] = None if any(a is None for a, _ in pairs) else max(abs(a - e) for a, e in pairs)
    return out
