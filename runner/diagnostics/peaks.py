"""Does |psi|^2 hold weight where the samples never go? A search for configurations with a larger
|psi| than every sample, and what finding one proves.

A Metropolis chain of local moves can miss configurations that hold nearly all of |psi|^2: a
6 x 6 state put e^78 times more |psi|^2 on a few stripe configurations than on any of its samples,
and every sampled estimate of its energy was wrong by 130 (docs/accuracy.md). No sampled
statistic can show this; a configuration c found with log|psi(c)|^2 - max over samples of
log|psi|^2 = r proves it when r is large enough: the D configurations of the space whose
|psi|^2 is at most the samples' largest together weigh at most D e^{-r} |psi(c)|^2, so one
sample of |psi|^2 lands among them with probability at most D e^{-r} (whatever the correlations
between samples), and every sample did.

The search is a greedy ascent of log|psi|: from the chains' last configurations and from
configurations drawn uniformly in the space, each step moves to the best of all exchanges of
two unequal spins (and, without a fixed total S^z, all single flips) until no move raises
log|psi|. Spaces of at most `EXHAUSTIVE_STATES` states are evaluated whole instead. Not
finding such a configuration proves nothing: the search looks at a tiny part of a large space.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from runner.core.sampler import random_state
from runner.physics.hilbert import Hilbert, all_states

EXHAUSTIVE_STATES = 2**16  # evaluate every configuration of spaces this small (and <= 20 sites)
BATCH = 2048  # configurations per call of the model
GROUP_CONFIGURATIONS = 2**16  # neighbours held at once (memory: this x N bytes)
MAX_EVALUATIONS = 2**23  # of log|psi| in one search (48 starts on 6 x 6: about 1.1e5; on 10 x 10: 3.2e6)
P_WRONG = 1e-3  # a bound on the samples' probability below this: the estimates are wrong


def log_abs_evaluator(problem):
    """params -> log_abs, where log_abs maps configurations [K, N] (NumPy) to log|psi| [K]
    (float64 NumPy), evaluated on the default device in batches of `BATCH` (compiled once per
    evaluator, whatever the parameters)."""
    fn = jax.jit(lambda params, sigma: jnp.real(problem.logpsi(params, sigma)))

    def at(params):
        def log_abs(sigma_KxN):
            sigma_KxN = np.asarray(sigma_KxN, np.int8)
            out = []
            for i in range(0, len(sigma_KxN), BATCH):
                block = sigma_KxN[i:i + BATCH]
                padded = np.concatenate([block, np.repeat(block[:1], BATCH - len(block), axis=0)])
                out.append(np.asarray(fn(params, jnp.asarray(padded)), np.float64)[: len(block)])
            return np.concatenate(out) if out else np.zeros((0,))

        return log_abs

    return at


def uniform_configurations(hilbert: Hilbert, n: int, seed: int, salt: int = 0) -> np.ndarray:
    """`n` configurations [n, N] drawn uniformly from the space (with its total S^z) by
    `runner.core.sampler.random_state`, from the key of `seed` folded with `salt` (one program:
    run op by op, each of its operations would be compiled on its own)."""

    def draw():
        keys = jax.random.split(jax.random.fold_in(jax.random.PRNGKey(seed), salt), n)
        return jax.vmap(functools.partial(random_state, hilbert))(keys)

    return np.asarray(jax.jit(draw)(), np.int8).reshape(n, hilbert.n_sites)


def _moves(hilbert: Hilbert):
    """The moves of one ascent step: pairs (i, j) exchanged; i == j flips site i (only without a
    fixed total S^z)."""
    i_M, j_M = np.triu_indices(hilbert.n_sites, k=0 if hilbert.n_up is None else 1)
    return i_M, j_M


def _neighbours(x_N, i_M, j_M):
    """The configurations one move from x_N that differ from it: [M', N]."""
    a_M, b_M = x_N[i_M], x_N[j_M]
    flip = i_M == j_M
    keep = flip | (a_M != b_M)
    i_M, j_M, a_M, b_M, flip = i_M[keep], j_M[keep], a_M[keep], b_M[keep], flip[keep]
    rows = np.arange(len(i_M))
    nb_MxN = np.repeat(x_N[None, :], len(i_M), axis=0)
    nb_MxN[rows, i_M] = np.where(flip, -a_M, b_M)
    nb_MxN[rows[~flip], j_M[~flip]] = a_M[~flip]
    return nb_MxN


def ascend(log_abs, hilbert: Hilbert, starts_KxN, max_evaluations: int = MAX_EVALUATIONS):
    """Greedy ascent of log|psi| from each start (see the module docstring), the starts taking
    one step each in turn, until every one is at a local maximum under the moves or
    `max_evaluations` evaluations of log|psi| are spent.

    Returns:
        (x_KxN, log_abs_K, complete): where each ascent stopped, log|psi| there, and whether
        every ascent reached a local maximum.
    """
    x_KxN = np.array(starts_KxN, np.int8)
    value_K = log_abs(x_KxN)
    i_M, j_M = _moves(hilbert)
    per_group = max(1, GROUP_CONFIGURATIONS // len(i_M))  # starts whose neighbours are evaluated together
    active, spent = list(range(len(x_KxN))), len(x_KxN)
    while active:
        moved = []
        for g in range(0, len(active), per_group):
            group = active[g:g + per_group]
            nbs = [_neighbours(x_KxN[k], i_M, j_M) for k in group]
            n = sum(len(nb) for nb in nbs)
            if spent + n > max_evaluations:
                return x_KxN, value_K, False
            values = np.split(log_abs(np.concatenate(nbs)), np.cumsum([len(nb) for nb in nbs])[:-1])
            spent += n
            for k, nb_MxN, values_M in zip(group, nbs, values):
                best = int(np.argmax(values_M)) if len(values_M) else 0
                if len(values_M) and values_M[best] > value_K[k]:
                    x_KxN[k], value_K[k] = nb_MxN[best], values_M[best]
                    moved.append(k)
        active = moved
    return x_KxN, value_K, True


def search(log_abs, hilbert: Hilbert, starts_KxN, n_starts: int, seed: int, salt: int = 0):
    """`ascend` from `starts_KxN` and `n_starts` uniform configurations (`uniform_configurations`).

    Returns:
        (x_KxN, log_abs_K, complete) as `ascend`.
    """
    starts_KxN = np.asarray(starts_KxN, np.int8).reshape(-1, hilbert.n_sites)
    return ascend(log_abs, hilbert, np.concatenate([starts_KxN, uniform_configurations(hilbert, n_starts, seed, salt)]))


def check(problem, params, sampled_log_abs_max: float, starts_KxN, n_starts: int, seed: int) -> dict:
    """Looks for a configuration with a larger |psi| than every sample (module docstring).

    Args:
        problem: the run's `runner.core.vmc.Problem`.
        params: its parameters (on the host or replicated).
        sampled_log_abs_max: the largest log|psi| of the samples an estimate used.
        starts_KxN: configurations to start from besides the uniform ones (the chains' last).
        n_starts: configurations drawn uniformly to start from.
        seed: for the uniform draws.

    Returns:
        {"method": "exhaustive", "search" or "search (stopped after MAX_EVALUATIONS)", "starts",
        "sampled_log_abs_max", "found_log_abs_max",
        "log_ratio" (log of |psi|^2 at the best configuration found over the samples' largest),
        "log_n_states", "log10_p_bound" (a sample of |psi|^2 lies at or below the samples'
        largest |psi|^2 with probability at most 10^this; 0: no bound), "wrong" (that bound below
        `P_WRONG`: the samples are not from |psi|^2 and the estimates from them are wrong),
        "local_energy" (the real part of E_loc at the best configuration; None when no sample
        was below it) and "configuration" ("+"/"-", site 0 first)}.
    """
    from runner.core.local_energy import local_energies_of

    hilbert = problem.sampler.hilbert
    log_abs = log_abs_evaluator(problem)(params)
    if hilbert.n_states <= EXHAUSTIVE_STATES and hilbert.n_sites <= 20:
        method, x_KxN = "exhaustive", all_states(hilbert)
        value_K = log_abs(x_KxN)
    else:
        x_KxN, value_K, complete = search(log_abs, hilbert, starts_KxN, n_starts, seed)
        method = "search" if complete else "search (stopped after MAX_EVALUATIONS)"
    k = int(np.argmax(value_K))
    found = float(value_K[k])
    log_ratio = 2.0 * (found - float(sampled_log_abs_max))
    log_n_states = math.log(hilbert.n_states)
    log10_p = min(0.0, (log_n_states - log_ratio) / math.log(10.0))
    eloc = None
    if log_ratio > 0:  # something the samples did not reach
        eloc = float(np.real(local_energies_of(problem, params, x_KxN[k:k + 1])[0]))
    return {
        "method": method,
        "starts": 0 if method == "exhaustive" else len(x_KxN),
        "sampled_log_abs_max": float(sampled_log_abs_max),
        "found_log_abs_max": found,
        "log_ratio": log_ratio,
        "log_n_states": log_n_states,
        "log10_p_bound": log10_p,
        "wrong": bool(log10_p < math.log10(P_WRONG)),
        "local_energy": eloc,
        "configuration": "".join("+" if s > 0 else "-" for s in x_KxN[k]),
    }


def check_estimate(problem, params, metrics: dict, sigma_CxN, n_starts: int, seed: int) -> dict | None:
    """`check` after an estimate whose `metrics` hold "log_abs_max", from the chains `sigma_CxN`;
    None after a full sum (no "log_abs_max": no sample to miss anything) or with n_starts = 0
    (the config's `peak_search=0`: off)."""
    if metrics.get("log_abs_max") is None or n_starts == 0:
        return None
    return check(problem, params, metrics["log_abs_max"], sigma_CxN, n_starts, seed)

