"""One optimisation step's numbers, computed as the runner computes them."""

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from runner.core import sampler as smp
from runner.core.problem import draw
from runner.core.vmc import energy_and_update
from runner.core.wavefunction import gradient_mode


def full_sum_step(problem, params):
    """(energy stats, flat update) of one step of `problem` at `params` from fresh chains, jitted."""
    flat = ravel_pytree(params)[0]
    if gradient_mode(params, problem.model) == "split":
        flat = jnp.concatenate([flat.real, flat.imag])
    solver = problem.precondition.init(flat)

    @jax.jit
    def step(params, chains):
        _, sigma, w, _ = draw(problem, params, chains)
        stats, update, _, _ = energy_and_update(problem, params, sigma, solver, 0, w)
        return stats, ravel_pytree(update)[0]

    return step(params, smp.init_chains(problem.sampler, 0))
