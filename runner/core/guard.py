"""Step rejection (`Problem.reject_jump`): a step whose samples say the energy jumped is undone."""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from runner.core.problem import VMCState


class Guard(NamedTuple):
    """What rejecting a step needs: the state the last accepted step started from, its energy
    estimate, and the factor on the next update."""

    params: Any
    opt_state: Any
    solver: Any
    energy: jax.Array  # real scalar; +inf before the first step (nothing to compare with)
    error: jax.Array
    scale: jax.Array  # the ceiling, halved by each rejection, doubled (up to the ceiling) by each accepted step
    ceiling: Any = ()  # with `Problem.recover`: 1, halved by each recovery (`runner.lifecycle.ground_state.recover`);
    # without, () (a ceiling of 1, and a checkpoint as before the key existed)


def _guarded(k, state: VMCState, new_state: VMCState, stats):
    """(the next state, metrics) with `Problem.reject_jump` = k. The step's samples come from
    state.params, which the last accepted step produced; if their energy estimate lies more than
    k combined error bars above that step's, or its error bar is more than k times that step's (a
    tail of local energies the last update opened: a 6 x 6 J1-J2 run's estimate went from
    -71.54 +- 0.08 to -545 +- 515, then -7290 +- 9116, and its chains froze), or it is not
    finite, state.params is rejected: the next state goes back
    to the parameters, optimizer and preconditioner states that step started from, and the
    next update is scaled by half (each accepted step doubles the factor again, up to the guard's
    ceiling: 1, less after a recovery from a collapse, `runner.lifecycle.loop`). A
    jump of the energy is what a step that moved the state's weight onto configurations no
    sample had visited looks like: the sampled metric (and a trust region in it) cannot see
    such a step before it is taken.

    The step after a rejection measures the kept parameters again, from the chains where they
    are; it is never rejected, and its estimate becomes the reference: a jump there (or an
    estimate that is not finite, which then stops the run) is the
    samples finding something the kept state already had (a 6 x 6 run's chains found a
    configuration holding nearly all of |psi|^2 at E_loc = +60 only after the per-step
    estimates had said -71.6), which going further back would not mend. Every decision reads
    replicated statistics, so it is the same on every layout."""
    guard = state.guard
    energy, error = jnp.real(stats.mean).astype(guard.energy.dtype), stats.error_of_mean.astype(guard.error.dtype)
    ceiling = 1.0 if isinstance(guard.ceiling, tuple) else guard.ceiling
    remeasured = guard.scale < ceiling  # the last step was rejected: state.params is the kept state
    # an estimate that is not finite (energy, error bar or variance: what stops a run) is a jump too
    usable = jnp.isfinite(energy) & jnp.isfinite(error) & jnp.isfinite(stats.variance)
    rose = energy - guard.energy > k * jnp.sqrt(error**2 + guard.error**2)
    spread = jnp.isfinite(guard.energy) & (guard.error > 0) & (error > k * guard.error)
    jump = ~remeasured & (~usable | rose | spread)
    accepted = Guard(state.params, state.opt_state, state.solver, energy, error,
                     jnp.minimum(ceiling, 2.0 * guard.scale), guard.ceiling)
    rejected = guard._replace(scale=guard.scale / 2)
    pick = lambda a, b: jax.tree_util.tree_map(lambda x, y: jnp.where(jump, x, y), a, b)  # noqa: E731
    next_state = new_state._replace(params=pick(guard.params, new_state.params),
                                    opt_state=pick(guard.opt_state, new_state.opt_state),
                                    solver=pick(guard.solver, new_state.solver), guard=pick(rejected, accepted))
    metrics = {"rejected": jump.astype(jnp.int32), "step_scale": guard.scale}
    return next_state, metrics if isinstance(guard.ceiling, tuple) else {**metrics, "step_ceiling": guard.ceiling}
