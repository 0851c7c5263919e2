"""Local energies of Pauli sums: of one configuration, and of batches of samples.

Connected configurations and matrix elements; E_loc of one configuration (`local_energy`), of
samples [C, T] chunk by chunk (`local_energies`), and evaluating only nonzero elements.
"""


import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from runner.core.problem import Problem
from runner.core.wavefunction import ratio_of
from runner.physics.pauli import Hamiltonian, PauliSum


def _sign_products(sigma_N, sites_xS: np.ndarray, dtype):
    """prod_s sigma_ext[sites[..., s]] as `dtype` [...], with sigma_ext = (sigma, +1): one
    gather per column (no padded read when no index is the padding N)."""
    n = sigma_N.shape[-1]
    source = sigma_N if not np.any(sites_xS == n) else jnp.concatenate([sigma_N, jnp.ones((1,), sigma_N.dtype)])
    product = source[sites_xS[..., 0]]
    for s in range(1, sites_xS.shape[-1]):
        product = product * source[sites_xS[..., s]]
    return product.astype(dtype)


def _elements(ham: PauliSum, sigma_N):
    """(mel_K, diag): <sigma|H|sigma'_k> in the order of the masks, and <sigma|H|sigma>."""
    real = _real_dtype()
    dtype = real if ham.is_real else jnp.result_type(complex)
    if len(ham.diag_coef) and ham.diag_sites.shape[-1]:
        diag = _sign_products(sigma_N, ham.diag_sites, real) @ jnp.asarray(ham.diag_coef, real)
    else:
        diag = jnp.asarray(ham.diag_coef.sum(), real)  # the identity's coefficient, or 0
    mels = []
    for group in ham.groups:
        coef_KxT, const_K = (group.coef.real, group.const.real) if ham.is_real else (group.coef, group.const)
        mel = jnp.asarray(const_K, dtype)
        if group.sign_sites.shape[1] and group.sign_sites.shape[2]:
            signs_KxT = _sign_products(sigma_N, group.sign_sites, real)
            signed = jnp.sum(signs_KxT * jnp.asarray(coef_KxT, dtype), axis=-1)
            mel = signed if not np.any(const_K) else mel + signed
        mels.append(mel)
    mel_K = jnp.concatenate(mels) if mels else jnp.zeros((0,), dtype)
    return mel_K, diag


def _real_dtype():
    """The default float dtype (float64 under x64), used for matrix elements."""
    return jnp.result_type(float)


def flip_masks(ham: PauliSum) -> np.ndarray:
    """Sign masks [K, N]: connected configuration k is sigma * mask[k] (-1 where spins flip)."""
    masks = np.ones((ham.n_connected, ham.n_sites), np.int8)
    start = 0
    for group in ham.groups:
        k = np.arange(len(group.flip_sites))
        masks[start + k[:, None], group.flip_sites] = -1
        start += len(k)
    return masks


def connected(ham: PauliSum, sigma_N):
    """Connected configurations and matrix elements of one configuration.

    Args:
        ham: the Hamiltonian.
        sigma_N: spins [N] (+-1).

    Returns:
        (sigmap_KxN, mel_K, diag): the configuration under each flip mask, the elements
        <sigma|H|sigma'_k> (zero where the mask's terms annihilate sigma; complex when a
        string has an odd number of Y), and <sigma|H|sigma>.
    """
    sigmap_KxN = sigma_N[None, :] * jnp.asarray(flip_masks(ham), sigma_N.dtype)
    mel_K, diag = _elements(ham, sigma_N)
    return sigmap_KxN, mel_K, diag


def connected_moves(ham: PauliSum, sigma_N):
    """The connected configurations as moves, in the order of `connected`'s elements: a list
    of (sites_KxJ, delta_KxJ) groups, the K moves of a group each flipping J spins (groups by
    increasing J), delta = new - old = +-2."""
    return [
        (jnp.asarray(g.flip_sites, jnp.int32), -2 * sigma_N[g.flip_sites]) for g in ham.groups
    ]


def local_energy(ham: PauliSum, logpsi_fn, params, sigma_N, ratio_fn=None):
    """E_loc(s) = sum_s' <s|H|s'> psi(s') / psi(s) for one configuration.

    A zero element never multiplies its ratio, so a ratio that overflows (inf, or NaN from
    inf - inf) on a configuration H does not reach leaves E_loc finite.

    Args:
        ham: the Hamiltonian (any PauliSum).
        logpsi_fn: (params, sigma_xN) -> log psi [...], batched over leading axes.
        params: model parameters.
        sigma_N: spins [N].
        ratio_fn: optional (params, sigma_N, sites_KxJ, delta_KxJ) -> psi(s'_k) / psi(s) for
            each group of moves of `connected_moves`, for models that update cheaply.

    Returns:
        A scalar, complex when log psi or an element is complex.
    """
    mel_K, diag = _elements(ham, sigma_N)
    if ham.n_connected == 0:
        return diag
    if ratio_fn is None:
        sigmap_KxN = sigma_N[None, :] * jnp.asarray(flip_masks(ham), sigma_N.dtype)
        ratio_K = jnp.exp(logpsi_fn(params, sigmap_KxN) - logpsi_fn(params, sigma_N))
    else:
        ratio_K = jnp.concatenate([ratio_fn(params, sigma_N, *move) for move in connected_moves(ham, sigma_N)])
    return sum_elements(diag, mel_K, ratio_K)


def sum_elements(diag_x, mel_xK, ratio_xK):
    """E_loc [...] = diag + sum_k mel_k ratio_k, a zero element never multiplying its ratio (an
    overflowing ratio on a configuration H does not reach stays out of E_loc)."""
    terms_xK = mel_xK * ratio_xK
    return diag_x + jnp.sum(jnp.where(mel_xK != 0, terms_xK, jnp.zeros_like(terms_xK)), axis=-1)


def map_over_samples(fn, sigma_CxTxN, chunk_per_chain):
    """Applies fn to [C, t, N] blocks of samples, `chunk_per_chain` samples per chain at a time.

    The chain axis stays leading (and sharded); chunks run one after another. When the chunk
    does not divide T, the last block is padded with copies of each chain's first sample and
    their values are dropped.
    """
    C, T = sigma_CxTxN.shape[:2]
    if chunk_per_chain is None or chunk_per_chain >= T:
        return fn(sigma_CxTxN)
    n = -(-T // chunk_per_chain)
    pad = n * chunk_per_chain - T
    if pad:
        sigma_CxTxN = jnp.concatenate([sigma_CxTxN, jnp.repeat(sigma_CxTxN[:, :1], pad, axis=1)], axis=1)
    blocks = jnp.swapaxes(sigma_CxTxN.reshape(C, n, chunk_per_chain, -1), 0, 1)
    out = jax.lax.map(fn, blocks)
    return jax.tree_util.tree_map(
        lambda y: jnp.swapaxes(y, 0, 1).reshape(C, T + pad, *y.shape[3:])[:, :T], out
    )


def local_energies(problem: Problem, params, sigma_CxTxN):
    """E_loc for every sample, [C, T], in the parameters' precision (32-bit parameters under
    x64, i.e. mixed precision, would otherwise get 64-bit E_loc from the 64-bit matrix elements).

    A model without the `LocalRatios` fast path is evaluated only on the connected
    configurations whose matrix element is nonzero (`nonzero_local_energies`)."""
    ratio_fn = ratio_of(problem.model)
    if ratio_fn is None and problem.hamiltonian.n_connected:
        fn = functools.partial(nonzero_local_energies, problem.hamiltonian, problem.logpsi, params)
    else:
        fn = jax.vmap(jax.vmap(functools.partial(local_energy, problem.hamiltonian, problem.logpsi, params,
                                                 ratio_fn=ratio_fn)))
    eloc_CxT = map_over_samples(fn, sigma_CxTxN, problem.chunk_per_chain)
    real = jnp.finfo(jax.tree_util.tree_leaves(params)[0].dtype).dtype
    return eloc_CxT.astype(jnp.promote_types(real, jnp.float32) if jnp.isrealobj(eloc_CxT)
                           else jnp.promote_types(real, jnp.complex64))


def local_energies_of(problem: Problem, params, sigma_KxN):
    """E_loc of any configurations [K, N] (not a multiple of the chains: no chunks), as NumPy [K]."""
    plain = dataclasses.replace(problem, chunk_size=None)
    return np.asarray(local_energies(plain, params, jnp.asarray(sigma_KxN, jnp.int8)[None]))[0]


# The nonzero (sample, connected configuration) pairs of a chain are evaluated in blocks of
# 1/NONZERO_BLOCKS of all its pairs: at most that fraction of the full work is spent on padding,
# and the model sees C x block configurations at a time (memory bounded by the block). Each block
# is one more copy of the model in the compiled step: more blocks waste less and compile longer
# (bench: docs/notes/benchmarks.md, "Deep models").
NONZERO_BLOCKS = 16


def nonzero_local_energies(ham: Hamiltonian, logpsi_fn, params, sigma_CxTxN):
    """E_loc [C, T] as `local_energy` gives it, evaluating log psi only on the
    connected configurations with a nonzero matrix element.

    In an Sz sector a Heisenberg bond connects only where its two spins differ, so about half
    of the K flip masks of a sample give a zero element; a generic model's cost is its number of
    evaluations. Per chain the nonzero pairs (t, k) are packed in (t, k) order and evaluated
    block by block, the blocks past every chain's last nonzero pair skipped; the
    per-pair log psi are then read back into [C, T, K] and summed over k exactly as
    `local_energy` sums them (zero elements never multiply their ratio).

    Args:
        ham: the Hamiltonian, with n_connected > 0.
        logpsi_fn: (params, sigma_xN) -> log psi [...], batched over leading axes.
        params: model parameters.
        sigma_CxTxN: samples (int8 spins), C chains of T.

    Returns:
        E_loc [C, T], complex when log psi or an element is complex.
    """
    C, T, N = sigma_CxTxN.shape
    _, mel_CxTxK, diag_CxT = jax.vmap(jax.vmap(functools.partial(connected, ham)))(sigma_CxTxN)
    K = mel_CxTxK.shape[-1]
    M = T * K
    block = -(-M // NONZERO_BLOCKS)
    nonzero_CxM = (mel_CxTxK != 0).reshape(C, M)
    count_C = jnp.sum(nonzero_CxM, axis=1, dtype=jnp.int32)
    # Nonzero pairs first, each group in increasing (t, k) order; padded to whole blocks.
    order_CxM = jnp.argsort(~nonzero_CxM, axis=1, stable=True).astype(jnp.int32)
    order_CxM = jnp.pad(order_CxM, ((0, 0), (0, NONZERO_BLOCKS * block - M)))
    masks_KxN = jnp.asarray(flip_masks(ham), sigma_CxTxN.dtype)
    logpsi_CxT = logpsi_fn(params, sigma_CxTxN)
    n_done = jnp.max(count_C)  # over all chains: the same blocks run on every layout

    def evaluate(i):
        pair_CxB = order_CxM[:, i * block:(i + 1) * block]
        sigma_CxBxN = jnp.take_along_axis(sigma_CxTxN, (pair_CxB // K)[..., None], axis=1)
        return logpsi_fn(params, sigma_CxBxN * masks_KxN[pair_CxB % K]).astype(logpsi_CxT.dtype)

    # One conditional per block, not a loop: XLA:CPU compiles a loop with a small carry into a
    # single kernel (runner.parallel.runtime.SMALL_LOOP_BYTES), whose matrix products run about 2x slower.
    skipped_CxB = jnp.zeros((C, block), logpsi_CxT.dtype)
    packed_CxM = jnp.concatenate([jax.lax.cond(i * block < n_done, functools.partial(evaluate, i), lambda: skipped_CxB)
                                  for i in range(NONZERO_BLOCKS)], axis=1)
    # Pair m's place in the packed list is the number of nonzero pairs before it.
    rank_CxM = jnp.cumsum(nonzero_CxM, axis=1, dtype=jnp.int32) - 1
    logpsi_CxTxK = jnp.take_along_axis(packed_CxM, jnp.maximum(rank_CxM, 0), axis=1).reshape(C, T, K)
    return sum_elements(diag_CxT, mel_CxTxK, jnp.exp(logpsi_CxTxK - logpsi_CxT[..., None]))
