"""Burn-in and the final energy estimate at fixed parameters, and a step's energy metrics."""

import dataclasses
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from runner.core.local_energy import local_energies, map_over_samples
from runner.core.problem import Problem, VMCState, draw, sums_exactly
from runner.core.sampler import MetropolisSampler, sample, training_power
from runner.core.stats import chain_max, statistics

BURN_IN_SWEEPS = 16
"""Sweeps per chain an estimate discards first when its chains were sampling another distribution
than |psi|^2 of the parameters it estimates (`final_burn_in`, `runner.evaluate`)."""


def burn_in_sweeps(sampler, sweeps: int) -> int:
    """The sweeps `burn_in` runs when asked for `sweeps`: none for a sampler without Markov chains
    (exact draws, a full sum)."""
    return sweeps if isinstance(sampler, MetropolisSampler) else 0


def final_burn_in(sampler) -> int:
    """Sweeps a run's final estimate discards before its rounds: `BURN_IN_SWEEPS` after training on
    samples of |psi|^p, p != 2 (the chains then sample |psi|^p, and the estimate |psi|^2), else
    none (the chains already sample |psi|^2, of parameters one step older; or there are none)."""
    return burn_in_sweeps(sampler, BURN_IN_SWEEPS if training_power(sampler) != 2.0 else 0)


def burn_in(problem: Problem, state: VMCState, sweeps: int) -> VMCState:
    """`state` with its Markov chains advanced `sweeps` sweeps of |psi|^2 at `state.params`, the
    configurations discarded; unchanged for `sweeps` 0 or a sampler without chains (exact, full sum).

    On two 6 x 6 CNNs trained on samples of |psi| (machine_pow 1, 128 chains), the first 8 sweeps
    of |psi|^2 after the switch gave local energies 0.034 and 0.038 above those of sweeps 17-48 on
    average (12 switches each, about 2 error bars; the unweighted mean over the samples of |psi|
    is 1.4 and 1.9 above): a final estimate of 32 sweeps per chain started there reads about 0.01
    high."""
    sampler, sweeps = problem.sampler, burn_in_sweeps(problem.sampler, sweeps)
    if sweeps == 0:
        return state
    burn = dataclasses.replace(sampler, n_samples=sampler.n_chains, n_discard_per_chain=sweeps - 1)
    chains, _, _ = sample(burn, problem.amplitude, state.params, state.chains)
    return state._replace(chains=chains)


class Rounds(NamedTuple):
    """An estimate from rounds of fresh samples of |psi|^2 at fixed parameters, as pure functions
    (`scan_rounds` samples and runs them in one program, `reduce_rounds` on samples drawn before):

    start: chains -> carry, what the rounds accumulate (() for none);
    one: (params, sigma_CxTxN, carry) -> (carry, values), what is kept of one round;
    pool: (carry, values_R, acceptance_R) -> the estimate, from the rounds' values and
        acceptances stacked along a leading round axis R.
    """

    start: Callable
    one: Callable
    pool: Callable


def energy_rounds(problem: Problem) -> Rounds:
    """The energy's `Rounds`: each round's E_loc [C, T] and largest log|psi| per chain [C], pooled
    by `pooled_metrics`."""
    return Rounds(start=lambda chains: (),
                  one=lambda params, sigma_CxTxN, carry: (carry, round_values(problem, params, sigma_CxTxN)),
                  pool=lambda carry, values_R, acceptance_R: pooled_metrics(*values_R, acceptance_R))


def round_values(problem: Problem, params, sigma_CxTxN):
    """(E_loc [C, T], the largest log|psi| of each chain's samples [C]) of one round of samples."""
    return local_energies(problem, params, sigma_CxTxN), log_abs_max(problem, params, sigma_CxTxN)


def pooled_metrics(eloc_RxCxT, log_abs_RxC, acceptance_R):
    """The energy metrics of R rounds, each chain's rounds one longer chain (the error and tau
    account for correlations between rounds), with "log_abs_max" over every sample."""
    eloc_CxRT = jnp.moveaxis(eloc_RxCxT, 0, 1).reshape(eloc_RxCxT.shape[1], -1)
    return {**_metrics(statistics(eloc_CxRT), jnp.mean(acceptance_R)),
            "log_abs_max": chain_max(jnp.moveaxis(log_abs_RxC, 0, 1))}


def scan_rounds(problem: Problem, rounds: Rounds, state: VMCState, n_rounds: int):
    """`rounds` over `n_rounds` consecutive rounds of `n_samples` of |psi|^2 (`sample`) at
    `state.params`, in one program (a `lax.scan`).

    Returns:
        (chains, estimate) with the advanced chains.
    """

    def one_round(carry, _):
        chains, kept = carry
        chains, sigma_CxTxN, acceptance = sample(problem.sampler, problem.amplitude, state.params, chains)
        kept, values = rounds.one(state.params, sigma_CxTxN, kept)
        return (chains, kept), (values, acceptance)

    (chains, kept), (values_R, acceptance_R) = jax.lax.scan(
        one_round, (state.chains, rounds.start(state.chains)), length=n_rounds)
    return chains, rounds.pool(kept, values_R, acceptance_R)


def reduce_rounds(rounds: Rounds, params, chains, sigma_RxCxTxN, acceptance_R):
    """`rounds` of samples drawn before, [R, C, T, N] with their acceptances [R]: what
    `scan_rounds` computes from the same samples. Each round's values are computed in a loop's
    body, as there: outside one, XLA may compile a model's arithmetic to other last bits.

    Returns:
        The estimate.
    """

    def one_round(kept, xs):
        sigma_CxTxN, acceptance = xs
        kept, values = rounds.one(params, sigma_CxTxN, kept)
        return kept, (values, acceptance)

    kept, (values_R, acceptance_R) = jax.lax.scan(one_round, rounds.start(chains), (sigma_RxCxTxN, acceptance_R))
    return rounds.pool(kept, values_R, acceptance_R)


def draw_rounds(problem, params, chains, rounds: int):
    """`runner.core.problem.draw`'s (chains, sigma [C, R T, N], w, acceptance) of `rounds` consecutive draws, each
    chain's rounds joined into one longer chain (so error bars see their correlation); one draw
    for rounds 1 or a full sum (more would repeat it). Unlike `Rounds`, which estimate from samples of
    |psi|^2 round by round, these are the training draw's samples (with its weights), pooled before use
    (the TDVP's measurement at a saved time, `runner.lifecycle.dynamics.measure`)."""
    if rounds == 1 or sums_exactly(problem):
        return draw(problem, params, chains)

    def one(chains, _):
        chains, sigma_CxTxN, w_CxT, acceptance = draw(problem, params, chains)
        return chains, (sigma_CxTxN, w_CxT, acceptance)

    chains, (sigma_RxCxTxN, w_RxCxT, acceptance_R) = jax.lax.scan(one, chains, length=rounds)
    join = lambda x: jnp.moveaxis(x, 0, 1).reshape(x.shape[1], -1, *x.shape[3:])  # noqa: E731
    return chains, join(sigma_RxCxTxN), None if w_RxCxT is None else join(w_RxCxT), jnp.mean(acceptance_R)


def estimate(problem: Problem, state: VMCState, n_rounds: int = 1):
    """Energy statistics at the current parameters from fresh samples (no update).

    Draws `n_rounds` consecutive rounds of `n_samples` from |psi|^2 (whatever the sampler's
    `machine_pow` for training); each chain's rounds are treated as one longer chain, so the
    error and tau account for correlations between rounds (`energy_rounds`). A full sum is
    summed once (more rounds would repeat it).

    Returns:
        (chains, metrics) with the advanced chains.
    """
    if sums_exactly(problem):
        chains, sigma_CxTxN, w_CxT, acceptance = draw(problem, state.params, state.chains)
        return chains, _metrics(statistics(local_energies(problem, state.params, sigma_CxTxN), w_CxT, exact=True),
                                acceptance)
    return scan_rounds(problem, energy_rounds(problem), state, n_rounds)


def draws_estimate_samples(problem: Problem) -> bool:
    """Whether a training step's samples (`runner.core.problem.draw`) are what a round of an
    estimate samples: `n_samples` of |psi|^2 without weights (not after training on |psi|^p,
    p != 2, whose weights make up for it; not a full sum, which an estimate sums once)."""
    return training_power(problem.sampler) == 2.0 and not sums_exactly(problem)


def log_abs_max(problem: Problem, params, sigma_CxTxN):
    """The largest log|psi| of each chain's samples, [C] (for `runner.diagnostics.peaks.check`: what the
    samples of an estimate reached)."""
    fn = lambda sigma: jnp.real(problem.logpsi(params, sigma))  # noqa: E731
    return jnp.max(map_over_samples(fn, sigma_CxTxN, problem.chunk_per_chain), axis=1)


def _metrics(stats, acceptance):
    return {
        "energy": jnp.real(stats.mean),
        "energy_imag": jnp.imag(stats.mean),
        "energy_error": stats.error_of_mean,
        "variance": stats.variance,
        "r_hat": stats.r_hat,
        "tau_corr": stats.tau_corr,
        "acceptance": acceptance,
    }
