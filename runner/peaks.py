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

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from runner.hilbert import Hilbert, all_states

DEFAULT_STARTS = 32  # configurations drawn uniformly to start from (the config's `peak_search`)
EXHAUSTIVE_STATES = 2**16  # evaluate every configuration of spaces this small (and <= 20 sites)
BATCH = 2048  # configurations per call of the model
P_WRONG = 1e-3  # a bound on the samples' probability below this: the estimates are wrong


def log_abs_function(problem, params):
    """log|psi| of configurations [K, N] (NumPy in, float64 NumPy out), evaluated on the default
    device in batches of `BATCH` (one compilation)."""
    fn = jax.jit(lambda sigma: jnp.real(problem.logpsi(params, sigma)))

    def log_abs(sigma_KxN):
        sigma_KxN = np.asarray(sigma_KxN, np.int8)
        out = []
        for i in range(0, len(sigma_KxN), BATCH):
            block = sigma_KxN[i:i + BATCH]
            padded = np.concatenate([block, np.repeat(block[:1], BATCH - len(block), axis=0)])
            out.append(np.asarray(fn(jnp.asarray(padded)), np.float64)[: len(block)])
        return np.concatenate(out) if out else np.zeros((0,))

    return log_abs


def uniform_configurations(hilbert: Hilbert, n: int, seed: int) -> np.ndarray:
    """`n` configurations [n, N] drawn uniformly from the space (with its total S^z)."""
    rng = np.random.default_rng(seed)
    N = hilbert.n_sites
    if hilbert.n_up is None:
        return rng.choice(np.array([-1, 1], np.int8), size=(n, N))
    row = np.where(np.arange(N) < hilbert.n_up, 1, -1).astype(np.int8)
    return np.array([rng.permutation(row) for _ in range(n)], np.int8).reshape(n, N)


def _moves(hilbert: Hilbert):
    """The moves of one ascent step: pairs (i, j) exchanged; i == j flips site i (only without a
    fixed total S^z)."""
    i_M, j_M = np.triu_indices(hilbert.n_sites, k=0 if hilbert.n_up is None else 1)
    return i_M, j_M


def _neighbours(x_KxN, i_M, j_M):
    """Every move applied to every configuration: [K, M, N], and [K, M] whether it changes it."""
    K, M = len(x_KxN), len(i_M)
    rows = np.arange(M)
    nb_KxMxN = np.repeat(x_KxN[:, None, :], M, axis=1)
    a_KxM, b_KxM = x_KxN[:, i_M], x_KxN[:, j_M]
    flip = i_M == j_M
    nb_KxMxN[:, rows, i_M] = np.where(flip, -a_KxM, b_KxM)
    nb_KxMxN[:, rows[~flip], j_M[~flip]] = a_KxM[:, ~flip]
    return nb_KxMxN, flip | (a_KxM != b_KxM)


def ascend(log_abs, hilbert: Hilbert, starts_KxN, max_steps: int | None = None):
    """Greedy ascent of log|psi| from each start (see the module docstring).

    Returns:
        (x_KxN, log_abs_K): where each ascent stopped (a local maximum under the moves, or after
        `max_steps`, by default 4 N) and log|psi| there.
    """
    x_KxN = np.array(starts_KxN, np.int8)
    value_K = log_abs(x_KxN)
    i_M, j_M = _moves(hilbert)
    active = np.arange(len(x_KxN))
    for _ in range(4 * hilbert.n_sites if max_steps is None else max_steps):
        if not len(active):
            break
        nb_KxMxN, valid_KxM = _neighbours(x_KxN[active], i_M, j_M)
        values_KxM = np.where(valid_KxM, log_abs(nb_KxMxN.reshape(-1, hilbert.n_sites)).reshape(valid_KxM.shape),
                              -np.inf)
        best_K = np.argmax(values_KxM, axis=1)
        best_value_K = values_KxM[np.arange(len(active)), best_K]
        up = best_value_K > value_K[active]
        moved = active[up]
        x_KxN[moved] = nb_KxMxN[np.flatnonzero(up), best_K[up]]
        value_K[moved] = best_value_K[up]
        active = moved
    return x_KxN, value_K


def check(problem, params, sampled_log_abs_max: float, starts_KxN, n_starts: int, seed: int) -> dict:
    """Looks for a configuration with a larger |psi| than every sample (module docstring).

    Args:
        problem: the run's `runner.vmc.Problem`.
        params: its parameters (on the host or replicated).
        sampled_log_abs_max: the largest log|psi| of the samples an estimate used.
        starts_KxN: configurations to start from besides the uniform ones (the chains' last).
        n_starts: configurations drawn uniformly to start from.
        seed: for the uniform draws.

    Returns:
        {"method": "exhaustive" or "search", "starts", "sampled_log_abs_max", "found_log_abs_max",
        "log_ratio" (log of |psi|^2 at the best configuration found over the samples' largest),
        "log_n_states", "log10_p_bound" (a sample of |psi|^2 lies at or below the samples'
        largest |psi|^2 with probability at most 10^this; 0: no bound), "wrong" (that bound below
        `P_WRONG`: the samples are not from |psi|^2 and the estimates from them are wrong),
        "local_energy" (the real part of E_loc at the best configuration; None when no sample
        was below it) and "configuration" ("+"/"-", site 0 first)}.
    """
    from runner.vmc import local_energies

    hilbert = problem.sampler.hilbert
    log_abs = log_abs_function(problem, params)
    if hilbert.n_states <= EXHAUSTIVE_STATES and hilbert.n_sites <= 20:
        method, x_KxN = "exhaustive", all_states(hilbert)
        value_K = log_abs(x_KxN)
    else:
        starts_KxN = np.concatenate([np.asarray(starts_KxN, np.int8).reshape(-1, hilbert.n_sites),
                                     uniform_configurations(hilbert, n_starts, seed)])
        method, (x_KxN, value_K) = "search", ascend(log_abs, hilbert, starts_KxN)
    k = int(np.argmax(value_K))
    found = float(value_K[k])
    log_ratio = 2.0 * (found - float(sampled_log_abs_max))
    log_n_states = math.log(hilbert.n_states)
    log10_p = min(0.0, (log_n_states - log_ratio) / math.log(10.0))
    eloc = None
    if log_ratio > 0:  # something the samples did not reach
        plain = dataclasses.replace(problem, chunk_size=None)
        eloc = float(np.real(np.asarray(local_energies(plain, params, jnp.asarray(x_KxN[k][None, None, :]))).ravel()[0]))
    return {
        "method": method,
        "starts": len(x_KxN) if method == "search" else 0,
        "sampled_log_abs_max": float(sampled_log_abs_max),
        "found_log_abs_max": found,
        "log_ratio": log_ratio,
        "log_n_states": log_n_states,
        "log10_p_bound": log10_p,
        "wrong": bool(log10_p < math.log10(P_WRONG)),
        "local_energy": eloc,
        "configuration": "".join("+" if s > 0 else "-" for s in x_KxN[k]),
    }
