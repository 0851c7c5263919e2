"""Local energies of Pauli sums: connected configurations, matrix elements, E_loc of one configuration."""


import jax.numpy as jnp
import numpy as np

from runner.physics.pauli import PauliSum


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
