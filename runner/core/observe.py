"""Observables on samples: local values in one pass, their statistics, the in-run measurement and the final estimate."""

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from runner.core import local_energy
from runner.core.estimate import Rounds, pooled_metrics, round_values, scan_rounds
from runner.core.estimate import estimate as estimate_energy
from runner.core.full_sum import FullSumSampler
from runner.core.local_energy import map_over_samples
from runner.core.sampler import full_sum
from runner.core.weights import full_sum_weights
from runner.core.stats import chain_sum, statistics
from runner.core.wavefunction import ratio_of
from runner.physics.observables import ERROR_PREFIX, MEASURED, PREFIX, STRUCTURE_FACTOR, Observables, _number


def _real():
    return jnp.result_type(float)


class Local(NamedTuple):
    """Local values of an observable set on samples [C, T]."""

    values_CxTxM: jax.Array  # real, the M Pauli-sum observables (real part: they are Hermitian)
    sq_CxTxQ: jax.Array  # real, S(q) of each sample on every momentum q


def _ratios(obs: Observables, logpsi_fn, ratio_fn, params, sigma_N):
    """psi(s'_k)/psi(s) [K] for the union's K distinct flip masks, each evaluated once."""
    if ratio_fn is not None:
        return jnp.concatenate([
            ratio_fn(params, sigma_N, jnp.asarray(sites), -2 * sigma_N[sites]) for sites in obs.union_groups
        ])
    masks_KxN = np.ones((obs.n_connected, obs.n_sites), np.int8)
    start = 0
    for sites in obs.union_groups:
        masks_KxN[start + np.arange(len(sites))[:, None], sites] = -1
        start += len(sites)
    sigmap_KxN = sigma_N[None, :] * jnp.asarray(masks_KxN, sigma_N.dtype)
    return jnp.exp(logpsi_fn(params, sigmap_KxN) - logpsi_fn(params, sigma_N))


def _in_sector(obs: Observables, sigma_N):
    """[K] whether flipping each union mask keeps total Sz (the flipped spins sum to 0)."""
    return jnp.concatenate([jnp.sum(sigma_N[sites].astype(jnp.int32), axis=1) == 0 for sites in obs.union_groups])


def phases(obs: Observables):
    """(cos, sin) of q.r_i, [Q, N] each."""
    angle_QxN = obs.momenta_QxD @ obs.positions_NxD.T
    return np.cos(angle_QxN), np.sin(angle_QxN)


def local_values_one(obs: Observables, logpsi_fn, params, sigma_N, ratio_fn=None):
    """(values_M, sq_Q) of one configuration: the observables' local values (real part) and S(q).

    Args:
        obs: the observable set.
        logpsi_fn: (params, sigma_xN) -> log psi [...].
        params: model parameters.
        sigma_N: spins [N].
        ratio_fn: optional fast ratios (see `local_energy.local_energy`).
    """
    real = _real()
    ratio_K = mask_K = None
    if obs.n_connected:
        ratio_K = _ratios(obs, logpsi_fn, ratio_fn, params, sigma_N)
        mask_K = _in_sector(obs, sigma_N) if obs.sector else None
    values = []
    for op, diag_fn, index in zip(obs.simulated, obs.diagonal, obs.union_index):
        if diag_fn is not None and not len(index):  # mz2: not its N^2 / 2 Z strings
            values.append(jnp.real(diag_fn(sigma_N)).astype(real))
            continue
        _, mel_K, diag = local_energy.connected(op, sigma_N)
        value = diag if diag_fn is None else diag_fn(sigma_N)
        if len(index):
            if mask_K is not None:  # a move out of the Sz sector has no element
                mel_K = jnp.where(mask_K[index], mel_K, jnp.zeros_like(mel_K))
            value = local_energy.sum_elements(value, mel_K, ratio_K[index])
        values.append(jnp.real(value).astype(real))
    values_M = jnp.stack(values) if values else jnp.zeros((0,), real)
    cos_QxN, sin_QxN = phases(obs)
    s_N = sigma_N.astype(real)
    sq_Q = ((jnp.asarray(cos_QxN, real) @ s_N) ** 2 + (jnp.asarray(sin_QxN, real) @ s_N) ** 2) / obs.n_sites
    return values_M, sq_Q


def local_values(obs: Observables, problem, params, sigma_CxTxN) -> Local:
    """Local values of every observable on every sample, in one pass (one ratio per distinct
    connected configuration), as many samples at a time as the run's steps evaluate
    (`Problem.per_chain_at_once`: every configuration of a full sum over orbits goes in blocks).

    Args:
        obs: the observable set.
        problem: the `runner.core.problem.Problem` (model, chunk size).
        params: model parameters.
        sigma_CxTxN: samples [C, T, N].

    Returns:
        Local(values_CxTxM, sq_CxTxQ), real.
    """
    one = lambda s: local_values_one(obs, problem.logpsi, params, s, ratio_of(problem.model))  # noqa: E731
    values, sq = map_over_samples(jax.vmap(jax.vmap(one)), sigma_CxTxN, problem.per_chain_at_once)
    return Local(values, sq)


def correlation_sums(sigma_CxTxN):
    """Per-chain sums of s_i s_j, [C, N, N] (real): the <Z_i Z_j> matrix needs no ratio."""
    s = sigma_CxTxN.astype(_real())
    return jnp.einsum("cti,ctj->cij", s, s)


def measure(obs: Observables, local: Local, w_CxT=None, exact=False) -> dict:
    """Means and error bars of every observable (jittable); `w_CxT`: None for samples of
    |psi|^2, importance weights, or with `exact` a full sum's weights (exact means, error 0).

    Returns:
        {"obs/<name>": mean, "obs_error/<name>": error} (replicated scalars), plus
        "obs/structure_factor_q_index" (the momentum of the largest S(q)) when reported.
    """
    columns = lambda x_CxTxM: jnp.moveaxis(x_CxTxM, 2, 0)  # noqa: E731
    return _measure_columns(obs, columns(local.values_CxTxM), columns(local.sq_CxTxQ), w_CxT, exact)[0]


def _measure_columns(obs: Observables, values_MxCxT, sq_QxCxT, w_CxT=None, exact=False):
    """`measure` from the local values laid out observable-first, and S(q)'s Stats [Q].

    The statistics go one observable after another (`lax.map`): vmapped, XLA:CPU's FFT meets a
    layout it refuses (RET_CHECK in fft_thunk) once the chains are sharded over devices.
    """
    out = {}
    stats_of = lambda x_CxT: statistics(x_CxT, w_CxT, exact)  # noqa: E731
    if obs.names:
        stats_M = jax.lax.map(stats_of, values_MxCxT)
        for m, name in enumerate(obs.names):
            out[PREFIX + name] = stats_M.mean[m]
            out[ERROR_PREFIX + name] = stats_M.error_of_mean[m]
    stats_Q = jax.lax.map(stats_of, sq_QxCxT)
    if obs.structure_factor:
        q = jnp.argmax(stats_Q.mean)
        out[PREFIX + STRUCTURE_FACTOR] = stats_Q.mean[q]
        out[ERROR_PREFIX + STRUCTURE_FACTOR] = stats_Q.error_of_mean[q]
        out[PREFIX + "structure_factor_q_index"] = q
    return out, stats_Q


def step_observer(obs: Observables | None, problem) -> Callable | None:
    """The `observe` hook of `runner.core.vmc.vmc_step`: (params, sigma_CxTxN, w_CxT, step) ->
    metrics, measuring on the step's own samples (with their importance weights w, or None)
    where step % every == 0 (a `lax.cond`: the other steps compute nothing) and NaN elsewhere,
    with MEASURED = 1.0 / 0.0. None when every = 0, so the step is exactly the plain one.

    With a full sum the measurement is exact (error 0) and sums over every configuration of the
    space, as the final estimate does: over orbits the step's configurations are one per orbit,
    and most observables differ between the members of an orbit (`every_configuration`)."""
    if obs is None or obs.every <= 0:
        return None
    full_sum = isinstance(problem.sampler, FullSumSampler)
    over_orbits = full_sum and problem.sampler.symmetry != "none"

    def observe(params, sigma_CxTxN, w_CxT, step):
        def on():
            sigma, w = (every_configuration(problem.sampler, problem.amplitude, params) if over_orbits
                        else (sigma_CxTxN, w_CxT))
            return {**measure(obs, local_values(obs, problem, params, sigma), w, exact=full_sum),
                    MEASURED: jnp.ones((), _real())}

        def off():
            def blank(s):
                return jnp.full(s.shape, jnp.nan if jnp.issubdtype(s.dtype, jnp.floating) else 0, s.dtype)

            return {**jax.tree_util.tree_map(blank, jax.eval_shape(on)), MEASURED: jnp.zeros((), _real())}

        return jax.lax.cond(step % obs.every == 0, on, off)

    return observe


def every_configuration(sampler: FullSumSampler, amplitude, params):
    """(sigma [C, T, N], w [C, T]): every configuration of a full sum's space (not one per
    orbit: most observables differ between the members of an orbit) and its exact weight."""
    every = sampler if sampler.symmetry == "none" else full_sum(sampler.hilbert, sampler.n_chains)
    sigma_CxTxN = jnp.asarray(every.sigma_CxTxN)
    return sigma_CxTxN, full_sum_weights(every, amplitude, params, sigma_CxTxN)


def estimate(problem, obs: Observables, state, n_rounds: int = 1):
    """Energy and observables at the current parameters from the same fresh samples (of |psi|^2,
    whatever the sampler's `machine_pow` for training).

    Like `runner.core.estimate.estimate` (each chain's `n_rounds` rounds are one longer chain), with the
    observables' local values, S(q) and the per-chain <Z_i Z_j> sums taken on those samples.

    Returns:
        (chains, (energy_metrics, measured)): the advanced chains; the energy's metrics as
        `runner.core.estimate.estimate` gives them; `measure`'s dict plus "zz_sum_CxNxN" (per-chain sums
        of s_i s_j over all rounds), "sq_mean_Q" and "sq_error_Q" (S(q) on every momentum).
    """
    if isinstance(problem.sampler, FullSumSampler):
        # The energy from the run's sum (over orbits with a symmetry), the observables from every
        # configuration.
        chains, energy = estimate_energy(problem, state)
        sigma_CxTxN, w_CxT = every_configuration(problem.sampler, problem.amplitude, state.params)
        local = local_values(obs, problem, state.params, sigma_CxTxN)
        out, stats_Q = _measure_columns(obs, jnp.moveaxis(local.values_CxTxM, 2, 0),
                                        jnp.moveaxis(local.sq_CxTxQ, 2, 0), w_CxT, exact=True)
        s_CxTxN = sigma_CxTxN.astype(_real())
        zz_NxN = chain_sum(jnp.einsum("ct,cti,ctj->cij", w_CxT, s_CxTxN, s_CxTxN))
        measured = {**out, "zz_exact_NxN": zz_NxN, "sq_mean_Q": stats_Q.mean, "sq_error_Q": stats_Q.error_of_mean}
        return chains, (energy, measured)

    return scan_rounds(problem, observed_rounds(problem, obs), state, n_rounds)


def observed_rounds(problem, obs: Observables) -> Rounds:
    """The `Rounds` of `estimate` (samples of |psi|^2, not a full sum): each round's E_loc, the
    observables' local values and largest log|psi| per chain, the <Z_i Z_j> sums carried over
    rounds; pooled as `runner.core.estimate.pooled_metrics` and `_measure_columns` pool them."""

    def start(chains):
        C, N = chains.sigma_CxN.shape
        return jnp.zeros((C, N, N), _real())

    def one(params, sigma_CxTxN, zz_CxNxN):
        eloc_CxT, log_abs_C = round_values(problem, params, sigma_CxTxN)
        local = local_values(obs, problem, params, sigma_CxTxN)
        return zz_CxNxN + correlation_sums(sigma_CxTxN), (eloc_CxT, local, log_abs_C)

    def pool(zz_CxNxN, values_R, acceptance_R):
        eloc_RxCxT, local_R, log_abs_RxC = values_R
        energy = pooled_metrics(eloc_RxCxT, log_abs_RxC, acceptance_R)
        out, stats_Q = _measure_columns(obs, _columns(local_R.values_CxTxM), _columns(local_R.sq_CxTxQ))
        measured = {**out, "zz_sum_CxNxN": zz_CxNxN, "sq_mean_Q": stats_Q.mean, "sq_error_Q": stats_Q.error_of_mean}
        return energy, measured

    return Rounds(start, one, pool)


def _columns(x_RxCxTxM):
    """[M, C, R*T]: each chain's rounds one after another, observable-first."""
    R, C, T, M = x_RxCxTxM.shape
    return jnp.transpose(x_RxCxTxM, (3, 1, 0, 2)).reshape(M, C, R * T)


def expect(obs: Observables, problem, params, sigma_CxTxN, w_CxT=None) -> dict:
    """{name: {"mean", "error"}} of every observable on given samples of |psi|^2 [C, T, N] (host
    values; jits the evaluation), or on a full sum's configurations with their weights w [C, T]
    (exact). For evaluation and the Python API."""
    fn = jax.jit(lambda p, s, w: measure(obs, local_values(obs, problem, p, s), w, exact=True))
    measured = jax.device_get(fn(params, sigma_CxTxN, w_CxT))
    out = {name: {"mean": _number(measured[PREFIX + name]), "error": _number(measured[ERROR_PREFIX + name])}
           for name in obs.all_names}
    return out
