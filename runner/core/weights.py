"""Weights of samples (the full sum's |psi|^2 and orbit sizes, a Markov chain's importance
weights), normalised with the chain reductions so they are the same bits on every layout."""

import jax
import jax.numpy as jnp

from runner.core.stats import chain_max, chain_sum


def full_sum_weights(sampler, amplitude, params, sigma_CxTxN):
    """w [C, T] of a `runner.core.full_sum.FullSumSampler`: |psi|^2 times the orbit size, normalised to sum 1 (0 on the padding;
    `normalised_weights`)."""
    log_abs_CxT = log_abs_of(amplitude, params, sigma_CxTxN)
    return normalised_weights(2.0 * log_abs_CxT + jnp.asarray(sampler.log_size_CxT, log_abs_CxT.dtype))


def importance_weights(sampler, amplitude, params, sigma_CxTxN):
    """w [C, T] proportional to |psi|^(2 - p), summing to 1: samples of |psi|^p (p the
    sampler's `machine_pow`) so weighted estimate expectation values in |psi|^2."""
    return normalised_weights((2.0 - sampler.machine_pow) * log_abs_of(amplitude, params, sigma_CxTxN))


def log_abs_of(amplitude, params, sigma_CxTxN):
    """log |psi| [C, T] of samples (`amplitude`: a `runner.core.sampler.Amplitude`), evaluated as the Markov chains evaluate it: one configuration
    per chain at a time, so the values are the same bits on every layout (one batch of all C T
    rows would let XLA pick a different matrix product for each layout's rows per device)."""
    tables = amplitude.prepare(params)
    log_abs_TxC = jax.lax.map(lambda sigma_CxN: amplitude.init(tables, sigma_CxN)[0], jnp.swapaxes(sigma_CxTxN, 0, 1))
    return log_abs_TxC.T


def normalised_weights(log_w_CxT):
    """exp(log w) / sum exp(log w) [C, T] (0 where log w is -inf). The largest log-weight
    (`chain_max`) is taken out before exponentiating and the normaliser is a `chain_sum`, so the
    weights are the same bits on every layout."""
    w_CxT = jnp.exp(log_w_CxT - chain_max(log_w_CxT))
    return w_CxT / chain_sum(jnp.sum(w_CxT, axis=1))
