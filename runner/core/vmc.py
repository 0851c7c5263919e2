"""The VMC step (`vmc_step`) and initial state, written once in the global view.

Samples carry a leading chain axis C (sharded over the mesh by the caller's shardings);
parameters and statistics are replicated. Every sum over samples is taken per chain and the C
partials combined in a fixed order (`runner.core.stats.chain_sum`), never by a reduction over the
sharded axis (whose all-reduce order depends on the layout): a run gives the same bits on one
device, several, or several processes, and no backend has its own path.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree

# Names that moved out of this module, importable here until their callers import them from their new homes.
from runner.core.estimate import (
    _metrics,
)
from runner.core.full_sum import FullSumSampler, symmetry_group
from runner.core.guard import Guard, _guarded
from runner.core.jacobian import (
    centred,
    jacobian,
    log_derivatives,
)
from runner.core.local_energy import (
    local_energies,
)
from runner.core.problem import Problem, VMCState, draw, sums_exactly
from runner.core.sampler import init_chains
from runner.core.stats import clip_outliers, effective_sample_fraction, statistics
from runner.core.wavefunction import (
    from_split,
    gradient_mode,
    to_split,
)
from runner.physics.symmetry import SYMMETRY_ZERO_LOG


def init_state(problem: Problem, seed: int, sample_sigma_N) -> VMCState:
    """Initial parameters (from the seed), optimizer state and chains."""
    key = jax.random.fold_in(jax.random.PRNGKey(seed), 2**31 - 1)
    params = problem.model.init(key, sample_sigma_N)["params"]
    flat, _ = ravel_pytree(params)
    if gradient_mode(params, problem.model) == "split":
        flat = to_split(flat)
    opt_state, solver = problem.optimizer.init(params), problem.precondition.init(flat)
    guard = ()
    if problem.reject_jump is not None:
        real = jnp.finfo(flat.dtype).dtype
        one = jnp.ones((), real)
        guard = Guard(params, opt_state, solver, jnp.asarray(jnp.inf, real), jnp.zeros((), real), one,
                      one if problem.recover else ())
    return VMCState(params, opt_state, init_chains(problem.sampler, seed), jnp.zeros((), jnp.int32), solver, guard)


def energy_and_update(problem: Problem, params, sigma_CxTxN, solver, step=0, w_CxT=None):
    """Statistics of E_loc, the preconditioned gradient as a parameter pytree, the
    preconditioner's next state (`solver`: its state from the previous step) and its info
    (a dict of scalars for the metrics: CG's iterations and residual; {} for direct solvers).
    `step`: the VMC step, which a diag_shift schedule reads. `w_CxT`: the weights `draw` gives
    (a full sum's, or importance weights), None for samples of |psi|^2.

    Gradient convention (NetKet 3.23's, so learning rates transfer): dE/dtheta = 2 Re<O* (E_loc - E)>
    for real parameters; dE/dx + i dE/dy = 2 <O* (E_loc - E)> for complex z = x + i y, so a
    complex parameter moves exactly as the pair (x, y) of real ones would.
    """
    eloc_CxT = local_energies(problem, params, sigma_CxTxN)
    stats = statistics(eloc_CxT, w_CxT, exact=sums_exactly(problem))
    mode = gradient_mode(params, problem.model)
    jac = jacobian(problem, params, sigma_CxTxN, mode, w_CxT)
    if problem.clip_local_energy is None:
        eps_S = centred(eloc_CxT, w_CxT).reshape(-1)
    else:
        # A sample beside a near-node of psi (|psi(s)| << |psi(s')|) has a huge E_loc: rare,
        # but one such sample's gradient can throw the parameters far away.
        eps_S = centred(clip_outliers(eloc_CxT, problem.clip_local_energy), w_CxT).reshape(-1)
    solution_P, solver, info = problem.precondition.update(jac, eps_S, "real" if mode == "split" else mode, solver,
                                                           step)
    flat, unravel = ravel_pytree(params)
    # In split coordinates the solution is (dE/dx, dE/dy); the update is dE/dx + i dE/dy.
    update_P = from_split(solution_P) if mode == "split" else solution_P
    return stats, unravel(update_P.astype(flat.dtype)), solver, info


def vmc_step(problem: Problem, state: VMCState, observe=None):
    """One VMC iteration: sample, estimate the energy and its gradient, update parameters.

    `observe`: optional (params, sigma_CxTxN, w_CxT, step) -> dict of scalars, measured on the
    step's own samples (with their importance weights, or None) and added to the metrics
    (`runner.core.observe.step_observer`).

    Returns:
        (new_state, metrics): metrics are replicated scalars describing the parameters
        *before* the update (the energy the samples estimate), the preconditioner's info
        (`cg_iters`, `cg_residual` when SR solves with CG) and, with importance weights, the
        effective sample fraction `ess_fraction` (`runner.core.stats.effective_sample_fraction`).
    """
    return update_step(problem, state, draw(problem, state.params, state.chains), observe)


def update_step(problem: Problem, state: VMCState, drawn, observe=None):
    """`vmc_step` from the step's samples `drawn`, what `runner.core.problem.draw` gives at
    `state`: (chains, sigma_CxTxN, w_CxT, acceptance). Jitted apart from `draw`, the step's
    sampling is a program of its own, which a final estimate can run again
    (`runner.lifecycle.ground_state.CompiledStep`)."""
    chains, sigma_CxTxN, w_CxT, acceptance = drawn
    stats, grads, solver, info = energy_and_update(problem, state.params, sigma_CxTxN, state.solver, state.step,
                                                   w_CxT)
    if problem.learning_rate is not None:  # a schedule: the value this step's update uses, for the metrics
        info = {**info, "learning_rate": problem.learning_rate(schedule_step(state))}
    if w_CxT is not None and not sums_exactly(problem):
        info = {**info, "ess_fraction": effective_sample_fraction(w_CxT)}
    observed = observe(state.params, sigma_CxTxN, w_CxT, state.step) if observe is not None else {}
    if problem.reject_jump is not None:
        grads = jax.tree_util.tree_map(lambda g: g * state.guard.scale.astype(g.real.dtype), grads)
    updates, opt_state = problem.optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    new_state = VMCState(params, opt_state, chains, state.step + 1, solver, state.guard)
    if problem.reject_jump is not None:
        new_state, guarded = _guarded(problem.reject_jump, state, new_state, stats)
        info = {**info, **guarded}
    return new_state, {**_metrics(stats, acceptance), **info, **observed}


def schedule_counts(opt_state) -> list:
    """The counts of the optax schedules in an optimizer state (`optax.ScaleByScheduleState`, what
    `optax.sgd(learning_rate=schedule)` and its kin keep): the step each schedule reads next."""
    is_schedule = lambda x: isinstance(x, optax.ScaleByScheduleState)  # noqa: E731
    return [x.count for x in jax.tree_util.tree_leaves(opt_state, is_leaf=is_schedule) if is_schedule(x)]


def schedule_step(state: VMCState):
    """The step the learning-rate schedule reads at this state: its optimizer's one schedule count
    (behind the VMC step by two for each step `reject_jump` undid, which took the optimizer back),
    else the VMC step."""
    counts = schedule_counts(state.opt_state)
    return counts[0] if len(counts) == 1 else state.step


def full_sum_invariance_error(problem: Problem, params_list) -> str | None:
    """Why a full sum over orbits (`runner.core.sampler.full_sum` with a symmetry) would be wrong for
    this model, or None: for each of the given parameter sets, |psi| and the log-derivatives O
    must be the same on every symmetry image of a few of the summed configurations (so psi,
    E_loc and O are constant on each orbit, up to a parameter-independent phase: a momentum or
    parity sector). H's invariance is checked when the run is built (`runner.config.build`). Evaluates
    the model: call it after the runtime is set up."""
    sampler = problem.sampler
    if not isinstance(sampler, FullSumSampler) or sampler.symmetry == "none":
        return None
    group_GxN = symmetry_group(sampler.hilbert, sampler.symmetry)
    N = sampler.hilbert.n_sites
    reps_KxN = sampler.sigma_CxTxN.reshape(-1, N)[: sampler.n_configurations]
    reps_KxN = reps_KxN[np.linspace(0, len(reps_KxN) - 1, min(32, len(reps_KxN))).astype(int)]
    images_KxGxN = jnp.asarray(reps_KxN[:, group_GxN])

    @jax.jit  # the images an argument: as a constant XLA folds the model's gathers of them for minutes
    def deviations(params, images_KxGxN):  # of log |psi| and of O from their values on the representatives
        log_abs_KxG = jnp.real(problem.logpsi(params, images_KxGxN))
        O_KxGxP = log_derivatives(dataclasses.replace(problem, chunk_size=None), params, images_KxGxN,
                                  gradient_mode(params, problem.model))
        # a sector's projection vanishes on some orbits (psi = 0 there, weight 0 in the sum): those
        # representatives, and ones with |psi| at rounding level, say nothing of the invariance
        ref_K = log_abs_KxG[:, 0]
        kept_K = jnp.isfinite(ref_K) & (ref_K > jnp.max(jnp.where(jnp.isfinite(ref_K), ref_K, -jnp.inf)) - SYMMETRY_ZERO_LOG)
        abs_K = jnp.max(jnp.abs(log_abs_KxG - ref_K[:, None]) / (1.0 + jnp.abs(ref_K[:, None])), axis=1)
        O_K = jnp.max(jnp.abs(O_KxGxP - O_KxGxP[:, :1]), axis=(1, 2))
        O_scale = jnp.max(jnp.where(kept_K[:, None, None], jnp.abs(O_KxGxP), 0.0))
        return jnp.max(jnp.where(kept_K, abs_K, 0.0)), jnp.max(jnp.where(kept_K, O_K, 0.0)) / (1.0 + O_scale)

    for params in params_list:
        abs_off, O_off = deviations(params, images_KxGxN)
        tol = float(np.sqrt(jnp.finfo(abs_off.dtype).eps))
        if not (abs_off <= tol and O_off <= tol):
            return (f"{sampler.symmetry} needs a model invariant under the group, and this one is not (|psi| or "
                    f"its derivatives change on symmetry images by up to {max(float(abs_off), float(O_off)):.1e}); "
                    "use rbm_symm with that group, a model with a model.sector (at k = 0 for lattice), or "
                    "sampler.symmetry=none")
    return None


