"""Metropolis-Hastings proposal rules: small functions of one chain, batched with `vmap` by the sampler."""

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class Rule(NamedTuple):
    """A Metropolis-Hastings proposal for one chain.

    draw: (key, n) -> the random inputs of n proposals, drawn up front (cheaper than in the loop);
    propose: (sigma_N, x) -> (sites_K, values_K, log_q): the move sigma[sites] = values and
        log q(new -> old) - log q(old -> new), the Hastings correction (0 for a symmetric rule).
    """

    draw: Callable
    propose: Callable


def flip_site(sigma_N, site):
    """Local rule: flip the spin on `site` (symmetric)."""
    sites = jnp.reshape(site, (1,))
    return sites, -sigma_N[sites], jnp.zeros(())


def local_rule(n_sites: int) -> Rule:
    """Flip one site drawn uniformly."""
    return Rule(
        draw=lambda key, n: jax.random.randint(key, (n,), 0, n_sites, dtype=jnp.int32),
        propose=flip_site,
    )


def _hoppable(sigma_N, bonds):
    """[B] whether the two spins of each bond differ (a swap would change the state)."""
    return sigma_N[bonds[:, 0]] != sigma_N[bonds[:, 1]]


def swap_hoppable_bond(sigma_N, u, *, bonds):
    """Exchange rule: swap the spins of a bond drawn uniformly (by `u` in [0, 1)) among the
    bonds whose two spins differ, so no proposal is wasted on a no-op.

    The number of such bonds changes with the move, so the proposal is not symmetric:
    log_q = log n(old) - log n(new). With no such bond (a fully polarised sector) the move is
    a no-op. Swapping keeps the number of up spins, so the rule preserves `total_sz`.
    """
    bonds, u = jnp.asarray(bonds), jnp.asarray(u)
    hop_B = _hoppable(sigma_N, bonds)
    n_old = jnp.sum(hop_B, dtype=jnp.int32)
    k = jnp.minimum(jnp.floor(u * n_old).astype(jnp.int32), n_old - 1)
    bond = jnp.argmax(jnp.cumsum(hop_B, dtype=jnp.int32) > k)
    sites = bonds[bond]
    values = sigma_N[sites[::-1]]
    n_new = jnp.sum(_hoppable(apply_move(sigma_N, sites, values), bonds), dtype=jnp.int32)
    log_n = lambda n: jnp.log(jnp.maximum(n, 1).astype(u.dtype))  # noqa: E731
    return sites, values, log_n(n_old) - log_n(n_new)


def exchange_rule(bonds) -> Rule:
    """Swap the spins of a uniformly drawn bond among those whose spins differ."""
    bonds = np.asarray(bonds, np.int32)
    return Rule(
        draw=lambda key, n: jax.random.uniform(key, (n,)),
        propose=functools.partial(swap_hoppable_bond, bonds=bonds),
    )


def swap_any_pair(sigma_N, u, *, copies: int = 1):
    """Exchange rule over any distance: swap the spin on a site drawn uniformly (by u[0]) with one of
    the opposite spins of its copy drawn uniformly (by u[1]). Symmetric: each copy keeps its numbers of
    up and down spins, so q(old -> new) = q(new -> old); a no-op in a polarised copy."""
    n = sigma_N.shape[-1]
    width = n // copies
    i = jnp.minimum(jnp.floor(u[0] * n).astype(jnp.int32), n - 1)
    site_N = jnp.arange(n)
    opposite_N = (sigma_N != sigma_N[i]) & (site_N // width == i // width)
    m = jnp.sum(opposite_N, dtype=jnp.int32)
    k = jnp.minimum(jnp.floor(u[1] * m).astype(jnp.int32), m - 1)
    j = jnp.where(m > 0, jnp.argmax(jnp.cumsum(opposite_N, dtype=jnp.int32) > k), i)
    sites = jnp.stack([i, j]).astype(jnp.int32)
    return sites, sigma_N[sites[::-1]], jnp.zeros((), u.dtype)


def mixed_exchange_rule(bonds, far: float, copies: int = 1) -> Rule:
    """Each proposal is, with probability `far`, a swap of any two opposite spins (`swap_any_pair`), else
    a bond swap (`swap_hoppable_bond`). The choice does not depend on the state, so the kernel is a
    mixture of two that each keep |psi|^2, and keeps it; each carries its own Hastings correction."""
    bonds = np.asarray(bonds, np.int32)

    def propose(sigma_N, u):
        near = swap_hoppable_bond(sigma_N, u[0], bonds=bonds)
        anywhere = swap_any_pair(sigma_N, u[1:], copies=copies)
        return jax.tree_util.tree_map(lambda a, b: jnp.where(u[3] < far, b, a), near, anywhere)

    return Rule(draw=lambda key, n: jax.random.uniform(key, (n, 4)), propose=propose)


def bond_groups(n_sites: int, bonds) -> int:
    """How many groups the bonds join the sites into (connected components; a site without a bond
    is one): exchange moves keep the number of up spins in each."""
    root = np.arange(n_sites)

    def find(i):
        while root[i] != i:
            root[i] = root[root[i]]
            i = root[i]
        return i

    for i, j in np.asarray(bonds, np.int64).reshape(-1, 2):
        root[find(i)] = find(j)
    return len({find(i) for i in range(n_sites)})


def exchange_issue(n_sites: int, bonds, copies: int = 1, n_up: int | None = None) -> str | None:
    """Why the exchange rule cannot reach every configuration of the sector, or None: its bonds split
    each copy's sites into groups (with 0 < n_up < sites per copy), between which no swap moves an up
    spin, so a chain keeps the up spins of each group it started with."""
    groups, width = bond_groups(n_sites, bonds), n_sites // copies
    if groups <= copies or n_up is None or not 0 < n_up < width:
        return None
    return (f"swaps spins along bonds, which split the {width} sites into {groups // copies} groups: no chain "
            "could move an up spin from one to another; join them by edges or use sampler=exact")


def apply_move(sigma_N, sites_K, values_K):
    """sigma with sigma[sites] = values, written as selects: a scatter would keep XLA from
    compiling the Metropolis loop into a single kernel."""
    site_N = jnp.arange(sigma_N.shape[-1])
    for k in range(sites_K.shape[-1]):
        sigma_N = jnp.where(site_N == sites_K[k], values_K[k], sigma_N)
    return sigma_N
