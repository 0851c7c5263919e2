"""Markov-chain and exact samplers of |psi|^2 written for one global chain axis, the sampler
constructors (the `conf/sampler` targets, the full sum's included); the weights of samples are
`runner.core.weights`'.

Every chain owns one PRNG key, derived from the seed and its global index, so the samples do
not depend on how chains are spread over devices or processes. Proposal rules are small
functions of one chain (`runner.core.rules`), batched with `vmap`; the full sum's configurations
are `runner.core.full_sum`'s.
"""

import dataclasses
import functools
import logging
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from runner.core.full_sum import FULL_SUM_SYMMETRIES, FullSumSampler, orbits, symmetry_group

# Names that moved out of this module, importable here until their callers import them from their new homes.
from runner.core.rules import Rule, apply_move, exchange_issue, exchange_rule, local_rule, mixed_exchange_rule
from runner.errors import ConfigError, require_int, require_number
from runner.physics.hilbert import Hilbert, all_states


class ChainState(NamedTuple):
    """State of all chains (leading axis C, sharded over devices)."""

    sigma_CxN: jax.Array  # int8 spins
    key_C: jax.Array  # uint32 [C, 2], one key per chain


# --- how the sampler evaluates the wavefunction --------------------------------------------


class Amplitude(NamedTuple):
    """log |psi| for the sampler, with an optional per-chain cache for cheap local moves.

    prepare: params -> tables, computed once per call outside the Markov loop;
    init: (tables, sigma_CxN) -> (log_abs_C, cache);
    update: (tables, cache, proposed_CxN, sites_CxK, delta_CxK) -> (log_abs_C, cache) for
        the proposed configurations, which differ from the cached ones by `delta` (new - old)
        on `sites`. Models without a cache recompute from `proposed`.
    """

    prepare: Callable
    init: Callable
    update: Callable


def plain_amplitude(log_abs_fn) -> Amplitude:
    """An Amplitude without a cache: (params, sigma_xN) -> log |psi| on every proposal."""
    return Amplitude(
        prepare=lambda params: params,
        init=lambda params, sigma: (log_abs_fn(params, sigma), ()),
        update=lambda params, cache, proposed, sites, delta: (log_abs_fn(params, proposed), ()),
    )


@dataclasses.dataclass(frozen=True)
class MetropolisSampler:
    """Metropolis-Hastings with a symmetric proposal rule.

    Attributes:
        hilbert: the space sampled.
        rule: the proposal (see `Rule`).
        n_samples: total samples per call, over all chains.
        n_chains: total number of chains.
        n_discard_per_chain: sweeps thrown away at the start of each call.
        sweep_size: proposals between two recorded samples.
        machine_pow: p in (0, 2]: training samples are drawn from |psi|^p and reweighted by
            |psi|^(2-p) (`runner.core.problem.draw`); estimates always sample |psi|^2 (`sample`).
    """

    hilbert: Hilbert
    rule: Rule
    n_samples: int
    n_chains: int
    n_discard_per_chain: int
    sweep_size: int
    machine_pow: float = 2.0

    @property
    def samples_per_chain(self) -> int:
        return self.n_samples // self.n_chains


@dataclasses.dataclass(frozen=True)
class ExactSampler:
    """Independent draws from the exact |psi|^2 over the enumerated space (small spaces);
    `machine_pow` as for `MetropolisSampler`."""

    hilbert: Hilbert
    n_samples: int
    n_chains: int
    machine_pow: float = 2.0

    @property
    def samples_per_chain(self) -> int:
        return self.n_samples // self.n_chains


EXACT_SAMPLER_MAX_STATES = 2**16
FULL_SUM_MAX_STATES = 2**16


def markov_chain_advice(hilbert: Hilbert) -> str:
    """What a refusal of sampler=exact or full_sum suggests: the Markov-chain sampler that builds
    for this space (metropolis_local cannot keep a fixed hilbert.total_sz; metropolis_exchange
    needs one)."""
    why = "" if hilbert.total_sz is None else " (it keeps hilbert.total_sz fixed)"
    return f"use sampler={_markov_chain_for(hilbert)}{why}"


def _markov_chain_for(hilbert: Hilbert) -> str:
    """The Markov-chain sampler option that builds for this space (`markov_chain_advice`)."""
    return "metropolis_local" if hilbert.total_sz is None else "metropolis_exchange"


def _check_counts(n_samples, n_chains):
    require_int("n_chains", n_chains, minimum=1)
    require_int("n_samples", n_samples, minimum=1)
    if n_samples % n_chains:
        raise ConfigError(
            "n_samples",
            f"must be a multiple of sampler.n_chains={n_chains} (got {n_samples}); "
            f"try {max(n_chains, n_samples // n_chains * n_chains)}",
        )
    if n_samples // n_chains < 2:
        raise ConfigError("n_samples", f"must give at least 2 samples per chain (got {n_samples} for {n_chains} chains)")


def training_power(sampler) -> float:
    """The power p of |psi| that the sampler's training samples are drawn from: its
    `machine_pow`, or 2 for a sampler without one (the full sum's weights are |psi|^2)."""
    return getattr(sampler, "machine_pow", 2.0)


def _check_machine_pow(machine_pow) -> float:
    """machine_pow as a float in (0, 2]. Above 2 the weights |psi|^(2-p) would be largest where
    psi is smallest, the configurations the chains visit least: their variance can be infinite."""
    require_number("machine_pow", machine_pow, positive=True)
    if machine_pow > 2:
        raise ConfigError("machine_pow", f"must be at most 2 (got {machine_pow}): samples of |psi|^p with p > 2 "
                                         "reweighted to |psi|^2 can have an infinite variance")
    return float(machine_pow)


def _metropolis(hilbert, rule, *, n_samples, n_chains, n_discard_per_chain, sweep_size, machine_pow):
    _check_counts(n_samples, n_chains)
    if n_discard_per_chain is None:
        n_discard_per_chain = (n_samples // n_chains) // 10
    require_int("n_discard_per_chain", n_discard_per_chain, minimum=0)
    if sweep_size is None:
        sweep_size = hilbert.n_sites
    require_int("sweep_size", sweep_size, minimum=1)
    return MetropolisSampler(
        hilbert, rule, n_samples, n_chains, n_discard_per_chain, sweep_size, _check_machine_pow(machine_pow)
    )


def metropolis_local(
    hilbert: Hilbert,
    n_samples: int = 1024,
    n_chains: int = 16,
    n_discard_per_chain: int | None = None,
    sweep_size: int | None = None,
    machine_pow: float = 2.0,
) -> MetropolisSampler:
    """Metropolis with single spin flips. `n_discard_per_chain` null: a tenth of the samples
    per chain; `sweep_size` null: the number of sites; `machine_pow` p: training samples of
    |psi|^p, reweighted (see `MetropolisSampler`)."""
    if hilbert.total_sz is not None:
        raise ConfigError(
            "sampler",
            "metropolis_local flips single spins and cannot keep hilbert.total_sz fixed; "
            "use sampler=metropolis_exchange or hilbert.total_sz=null",
        )
    return _metropolis(hilbert, local_rule(hilbert.n_sites), n_samples=n_samples, n_chains=n_chains,
                       n_discard_per_chain=n_discard_per_chain, sweep_size=sweep_size, machine_pow=machine_pow)


def metropolis_exchange(
    hilbert: Hilbert,
    *,
    n_samples: int = 1024,
    n_chains: int = 16,
    n_discard_per_chain: int | None = None,
    sweep_size: int | None = None,
    machine_pow: float = 2.0,
    far_swap: float | None = None,
) -> MetropolisSampler:
    """Metropolis with swaps of the two spins on a nearest-neighbour bond whose spins differ
    (keeps Sz), or with probability `far_swap` (null: 0) of any two opposite spins (`rules.mixed_exchange_rule`:
    chains that a peaked |psi|^2 freezes under bond swaps mix); the other arguments as for `metropolis_local`."""
    if hilbert.total_sz is None:
        raise ConfigError("sampler", "metropolis_exchange conserves Sz and needs hilbert.total_sz to be set (e.g. 0)")
    if far_swap is not None and not 0 <= require_number("far_swap", far_swap) <= 1:
        raise ConfigError("far_swap", f"is a probability, from 0 to 1 or null (got {far_swap})")
    issue = exchange_issue(hilbert.n_sites, hilbert.bonds, hilbert.copies, hilbert.n_up) if not far_swap else None
    if issue:
        raise ConfigError("sampler", f"metropolis_exchange {issue} (or set sampler.far_swap)")
    rule = mixed_exchange_rule(hilbert.bonds, far_swap, hilbert.copies) if far_swap else exchange_rule(hilbert.bonds)
    return _metropolis(hilbert, rule, n_samples=n_samples, n_chains=n_chains,
                       n_discard_per_chain=n_discard_per_chain, sweep_size=sweep_size, machine_pow=machine_pow)


def exact(hilbert: Hilbert, n_samples: int = 1024, n_chains: int = 16, machine_pow: float = 2.0) -> ExactSampler:
    """Exact sampling from |psi|^2 (training samples from |psi|^p with `machine_pow` p,
    reweighted); only for spaces of at most 2^16 states."""
    _check_counts(n_samples, n_chains)
    if hilbert.n_states > EXACT_SAMPLER_MAX_STATES:
        raise ConfigError(
            "sampler",
            f"exact needs a Hilbert space of at most {EXACT_SAMPLER_MAX_STATES} states "
            f"(this one has {hilbert.n_states}); {markov_chain_advice(hilbert)}",
        )
    return ExactSampler(hilbert, n_samples, n_chains, _check_machine_pow(machine_pow))


# What `full_sum(beyond=...)` samples with where the space is beyond the full sum's reach.
BEYOND = {"metropolis_local": metropolis_local, "metropolis_exchange": metropolis_exchange}


def full_sum(hilbert: Hilbert, n_chains: int = 16, symmetry: str = "none", n_samples: int | None = None,
             beyond: str | None = None) -> "FullSumSampler | MetropolisSampler":
    """Sums over every configuration of the space (at most 2^16 of them, or of their orbits) with
    weights |psi|^2: exact expectation values for small lattices. `symmetry`: sum over one
    configuration per orbit of translations or of the whole space group (lattice), for a model
    and Hamiltonian invariant under it (checked when the run is built). `beyond` (null |
    metropolis_local | metropolis_exchange): the Markov chain sampler, of `n_samples` (null: its
    default) in `n_chains` chains, that a space beyond the full sum's reach gets instead (null: refused),
    so that one config runs at every size. Without `beyond`, `n_samples` is not used (a warning
    says so): accepted so that a config written for a sampler (an experiment, debug=fast) can
    switch to sampler=full_sum."""
    require_int("n_chains", n_chains, minimum=1)
    if symmetry not in FULL_SUM_SYMMETRIES:
        raise ConfigError("symmetry", f"must be one of {', '.join(FULL_SUM_SYMMETRIES)} (got {symmetry!r})")
    if beyond is not None and beyond not in BEYOND:
        raise ConfigError("beyond", f"must be null or one of {', '.join(BEYOND)} (got {beyond!r})")
    if hilbert.n_states > FULL_SUM_MAX_STATES:
        if beyond is not None:
            logging.info("sampler: the %d states are beyond the full sum's %d: %s", hilbert.n_states,
                         FULL_SUM_MAX_STATES, beyond)
            counts = {} if n_samples is None else {"n_samples": n_samples}  # null: the Markov sampler's default
            return BEYOND[beyond](hilbert, n_chains=n_chains, **counts)
        chain = _markov_chain_for(hilbert)
        raise ConfigError(
            "sampler",
            f"full_sum needs a Hilbert space of at most {FULL_SUM_MAX_STATES} states (this one has "
            f"{hilbert.n_states}); use sampler.beyond={chain} or sampler={chain} (the first sums where the space "
            "fits and samples beyond it)",
        )
    states_DxN = all_states(hilbert)
    if symmetry == "none":
        size_D = np.ones(len(states_DxN), np.int64)
    else:
        states_DxN, size_D = orbits(states_DxN, symmetry_group(hilbert, symmetry))
    D = len(states_DxN)
    if n_samples is not None and beyond is None:
        logging.warning("sampler.n_samples=%s is not used by full_sum, which sums over all %d configurations%s",
                        n_samples, D, "" if symmetry == "none" else " (orbits)")
    T = max(2, -(-D // n_chains))
    pad = n_chains * T - D
    sigma = np.concatenate([states_DxN, np.repeat(states_DxN[:1], pad, axis=0)])
    with np.errstate(divide="ignore"):
        log_size = np.log(np.concatenate([size_D, np.zeros(pad, np.int64)]).astype(np.float64))
    return FullSumSampler(hilbert, n_chains, symmetry, sigma.reshape(n_chains, T, -1), log_size.reshape(n_chains, T))


# --- chains -------------------------------------------------------------------------------

def chain_keys(seed: int, n_chains: int):
    """One key per chain, a function of the seed and the chain's global index only."""
    base = jax.random.PRNGKey(seed)
    return jax.vmap(lambda c: jax.random.fold_in(base, c))(jnp.arange(n_chains, dtype=jnp.uint32))


def random_state(hilbert: Hilbert, key):
    """A uniformly random configuration [N] (int8) of the (constrained) space (with copies, total_sz
    in each)."""
    n = hilbert.n_sites
    if hilbert.total_sz is None:
        return jnp.where(jax.random.bernoulli(key, 0.5, (n,)), 1, -1).astype(jnp.int8)
    if hilbert.copies == 1:
        up = jnp.arange(n) < hilbert.n_up
        return jnp.where(jax.random.permutation(key, up), 1, -1).astype(jnp.int8)
    width = n // hilbert.copies  # total_sz in each copy: each copy's spins permuted on their own
    up_KxW = jnp.broadcast_to(jnp.arange(width) < hilbert.n_up, (hilbert.copies, width))
    mixed = jax.vmap(jax.random.permutation)(jax.random.split(key, hilbert.copies), up_KxW)
    return jnp.where(mixed.reshape(n), 1, -1).astype(jnp.int8)


def init_chains(sampler, seed: int) -> ChainState:
    """Fresh chains: per-chain keys and uniformly random starting configurations."""
    key_C = chain_keys(seed, sampler.n_chains)
    split = jax.vmap(jax.random.split)(key_C)
    sigma_CxN = jax.vmap(functools.partial(random_state, sampler.hilbert))(split[:, 1])
    return ChainState(sigma_CxN=sigma_CxN, key_C=split[:, 0])


# --- sampling -----------------------------------------------------------------------------


def sample(sampler, amplitude: Amplitude, params, chains: ChainState, machine_pow: float = 2.0):
    """Draws `sampler.n_samples` configurations from |psi|^machine_pow (|psi|^2 unless a
    caller that reweights asks for another power: `runner.core.problem.draw`).

    Args:
        sampler: a MetropolisSampler or ExactSampler.
        amplitude: how to evaluate log |psi| (see `Amplitude`, `plain_amplitude`).
        params: model parameters (replicated).
        chains: current chain state (leading axis C).
        machine_pow: the power p of |psi| sampled.

    Returns:
        (chains, sigma_CxTxN, acceptance): the advanced chains, T = n_samples / n_chains
        samples per chain in chain order, and the mean acceptance rate (1 for exact).
    """
    if isinstance(sampler, ExactSampler):
        return _sample_exact(sampler, amplitude, params, chains, machine_pow)
    if isinstance(sampler, FullSumSampler):  # the same configurations every call
        sigma_CxTxN = jnp.asarray(sampler.sigma_CxTxN)
        return chains, sigma_CxTxN, jnp.ones(())
    return _sample_metropolis(sampler, amplitude, params, chains, machine_pow)


def _draw(sampler, key, n_steps):
    """Per-chain random numbers for a whole call, drawn up front (cheaper than in the loop)."""
    k_move, k_accept = jax.random.split(key)
    moves = sampler.rule.draw(k_move, n_steps)
    log_u = jnp.log(jax.random.uniform(k_accept, (n_steps,)))
    return moves, log_u


def _sample_metropolis(sampler: MetropolisSampler, amplitude: Amplitude, params, chains: ChainState, machine_pow):
    T = sampler.samples_per_chain
    n_sweeps = sampler.n_discard_per_chain + T
    n_steps = n_sweeps * sampler.sweep_size
    split = jax.vmap(jax.random.split)(chains.key_C)
    key_C, draw_C = split[:, 0], split[:, 1]
    moves_C, log_u_C = jax.vmap(functools.partial(_draw, sampler, n_steps=n_steps))(draw_C)
    moves_SxC = jnp.moveaxis(moves_C, 0, 1).reshape(n_sweeps, sampler.sweep_size, *moves_C.shape[:1], *moves_C.shape[2:])
    log_u_SxC = log_u_C.T.reshape(n_sweeps, sampler.sweep_size, -1)
    propose = jax.vmap(sampler.rule.propose)
    apply = jax.vmap(apply_move)
    tables = amplitude.prepare(params)

    def step(carry, xs):
        sigma_CxN, log_abs_C, cache, n_accepted_C = carry
        move_C, log_u_C = xs
        sites_CxK, values_CxK, log_q_C = propose(sigma_CxN, move_C)
        proposed_CxN = apply(sigma_CxN, sites_CxK, values_CxK)
        delta_CxK = values_CxK - jnp.take_along_axis(sigma_CxN, sites_CxK, axis=1)
        log_abs_new_C, cache_new = amplitude.update(tables, cache, proposed_CxN, sites_CxK, delta_CxK)
        accept_C = log_u_C < machine_pow * (log_abs_new_C - log_abs_C) + log_q_C
        keep = lambda new, old: jnp.where(accept_C.reshape(-1, *[1] * (new.ndim - 1)), new, old)  # noqa: E731
        sigma_CxN = keep(proposed_CxN, sigma_CxN)
        log_abs_C = keep(log_abs_new_C, log_abs_C)
        cache = jax.tree_util.tree_map(keep, cache_new, cache)
        return (sigma_CxN, log_abs_C, cache, n_accepted_C + accept_C), None

    def sweep(carry, xs):
        sigma_CxN, n_accepted_C = carry
        # A fresh cache every sweep: updates cannot accumulate rounding (one full
        # evaluation per sweep, 1/sweep_size of the work).
        log_abs_C, cache = amplitude.init(tables, sigma_CxN)
        (sigma_CxN, _, _, n_accepted_C), _ = jax.lax.scan(
            step, (sigma_CxN, log_abs_C, cache, n_accepted_C), xs
        )
        return (sigma_CxN, n_accepted_C), sigma_CxN

    n_accepted_C = jnp.zeros(chains.sigma_CxN.shape[0], jnp.int32)
    carry, sigma_SxCxN = jax.lax.scan(sweep, (chains.sigma_CxN, n_accepted_C), (moves_SxC, log_u_SxC))
    sigma_CxTxN = jnp.swapaxes(sigma_SxCxN[sampler.n_discard_per_chain :], 0, 1)
    acceptance = jnp.mean(carry[1]) / n_steps
    return ChainState(carry[0], key_C), sigma_CxTxN, acceptance


def _sample_exact(sampler: ExactSampler, amplitude: Amplitude, params, chains: ChainState, machine_pow):
    states_DxN = jnp.asarray(all_states(sampler.hilbert))
    log_p_D = machine_pow * amplitude.init(amplitude.prepare(params), states_DxN)[0]
    T = sampler.samples_per_chain
    split = jax.vmap(jax.random.split)(chains.key_C)
    key_C, draw_C = split[:, 0], split[:, 1]
    index_CxT = jax.vmap(lambda k: jax.random.categorical(k, log_p_D, shape=(T,)))(draw_C)
    sigma_CxTxN = states_DxN[index_CxT]
    return ChainState(sigma_CxTxN[:, -1], key_C), sigma_CxTxN, jnp.ones((), log_p_D.dtype)
