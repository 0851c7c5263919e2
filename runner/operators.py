"""Spin Hamiltonians as connected elements, and their local energies.

Every Hamiltonian here is a sum of three kinds of Pauli terms, which is all the local
energy needs to know:

    H = sum_b zz_coef[b] Z_i Z_j                      (diagonal, bonds zz_bonds[b] = (i, j))
      + sum_k x_coef[k] X_{x_sites[k]}                (single spin flips)
      + sum_e xy_coef[e] (X_i X_j + Y_i Y_j) / 2      (exchange on xy_bonds[e] = (i, j))

(X_i X_j + Y_i Y_j) / 2 = S+_i S-_j + S-_i S+_j flips an antiparallel pair with element 1
and annihilates a parallel one.
"""

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from runner.errors import ConfigError, require_number
from runner.hilbert import Hilbert


class Hamiltonian(NamedTuple):
    """Connected-element form of a spin Hamiltonian (see the module docstring)."""

    zz_bonds: np.ndarray  # int32 [B, 2]
    zz_coef: np.ndarray  # float [B]
    x_sites: np.ndarray  # int32 [K]
    x_coef: np.ndarray  # float [K]
    xy_bonds: np.ndarray  # int32 [E, 2]
    xy_coef: np.ndarray  # float [E]

    @property
    def n_connected(self) -> int:
        """Number of off-diagonal terms, i.e. connected configurations per sample."""
        return len(self.x_sites) + len(self.xy_bonds)


def _empty_pairs():
    return np.zeros((0, 2), np.int32), np.zeros((0,), np.float64)


def ising(hilbert: Hilbert, J: float = 1.0, h: float = 1.0) -> Hamiltonian:
    """Transverse-field Ising model H = -J sum_<ij> Z_i Z_j - h sum_i X_i.

    Args:
        hilbert: the lattice (its `total_sz` must be null: X does not conserve Sz).
        J: nearest-neighbour coupling.
        h: transverse field.
    """
    J = require_number("J", J)
    h = require_number("h", h)
    if hilbert.total_sz is not None:
        raise ConfigError(
            "hilbert.total_sz", "must be null for the Ising Hamiltonian, whose field X_i does not conserve Sz"
        )
    xy_bonds, xy_coef = _empty_pairs()
    return Hamiltonian(
        zz_bonds=hilbert.bonds,
        zz_coef=np.full(len(hilbert.bonds), -J),
        x_sites=np.arange(hilbert.n_sites, dtype=np.int32),
        x_coef=np.full(hilbert.n_sites, -h),
        xy_bonds=xy_bonds,
        xy_coef=xy_coef,
    )


def heisenberg(
    hilbert: Hilbert, J: float = 1.0, J2: float = 0.0, sign_rule: bool | None = None
) -> Hamiltonian:
    """Heisenberg model H = J sum_<ij> s_i.s_j + J2 sum_<<ij>> s_i.s_j with Pauli matrices s.

    s_i.s_j = Z_i Z_j + 2 (X_i X_j + Y_i Y_j) / 2, so each bond contributes a ZZ term and an
    exchange term of element 2J.

    Args:
        hilbert: the lattice.
        J: nearest-neighbour coupling.
        J2: next-nearest-neighbour coupling.
        sign_rule: apply the Marshall rotation prod_{i in sublattice 1} Z_i, which flips the
            sign of exchange between the two sublattices and leaves the spectrum unchanged.
            None applies it when the lattice is bipartite.
    """
    J = require_number("J", J)
    J2 = require_number("J2", J2)
    if sign_rule is None:
        sign_rule = hilbert.sublattice is not None
    elif not isinstance(sign_rule, bool):
        raise ConfigError("sign_rule", f"must be true, false or null (got {sign_rule!r})")
    if sign_rule and hilbert.sublattice is None:
        raise ConfigError(
            "sign_rule",
            "needs a bipartite lattice (use an even length with pbc=true, or pbc=false)",
        )
    bonds = np.concatenate([hilbert.bonds, hilbert.next_bonds]) if J2 else hilbert.bonds
    coef = np.concatenate([np.full(len(hilbert.bonds), J), np.full(len(hilbert.next_bonds), J2)])
    coef = coef[: len(bonds)]
    exchange = 2.0 * coef
    if sign_rule:
        cross = hilbert.sublattice[bonds[:, 0]] != hilbert.sublattice[bonds[:, 1]]
        exchange = np.where(cross, -exchange, exchange)
    return Hamiltonian(
        zz_bonds=bonds.astype(np.int32),
        zz_coef=coef,
        x_sites=np.zeros((0,), np.int32),
        x_coef=np.zeros((0,), np.float64),
        xy_bonds=bonds.astype(np.int32),
        xy_coef=exchange,
    )


def diagonal(ham: Hamiltonian, sigma_xN):
    """Diagonal energy sum_b c_b s_i s_j for spins `sigma_xN` [..., N] -> [...]."""
    i, j = ham.zz_bonds[:, 0], ham.zz_bonds[:, 1]
    coef = jnp.asarray(ham.zz_coef, dtype=_real_dtype())
    return (sigma_xN[..., i] * sigma_xN[..., j]).astype(coef.dtype) @ coef


def _real_dtype():
    """The default float dtype (float64 under x64), used for matrix elements."""
    return jnp.result_type(float)


def flip_masks(ham: Hamiltonian, n_sites: int) -> np.ndarray:
    """Sign masks [K, N]: connected config k is sigma * mask[k] (-1 where spins flip)."""
    masks = np.ones((ham.n_connected, n_sites), np.int8)
    k1 = len(ham.x_sites)
    masks[np.arange(k1), ham.x_sites] = -1
    e = np.arange(len(ham.xy_bonds))
    masks[k1 + e, ham.xy_bonds[:, 0]] = -1
    masks[k1 + e, ham.xy_bonds[:, 1]] = -1
    return masks


def connected(ham: Hamiltonian, sigma_N):
    """Connected configurations and matrix elements of one configuration.

    Args:
        ham: the Hamiltonian.
        sigma_N: spins [N] (+-1).

    Returns:
        (sigmap_KxN, mel_K, diag): connected configurations, their off-diagonal elements
        <sigma|H|sigma'_k> (zero where the term annihilates sigma), and <sigma|H|sigma>.
    """
    n = sigma_N.shape[-1]
    masks_KxN = jnp.asarray(flip_masks(ham, n), sigma_N.dtype)
    sigmap_KxN = sigma_N[None, :] * masks_KxN
    dtype = _real_dtype()
    x_mel = jnp.asarray(ham.x_coef, dtype)
    i, j = ham.xy_bonds[:, 0], ham.xy_bonds[:, 1]
    antiparallel = (1 - sigma_N[i] * sigma_N[j]) / 2
    xy_mel = jnp.asarray(ham.xy_coef, dtype) * antiparallel.astype(dtype)
    mel_K = jnp.concatenate([x_mel, xy_mel])
    return sigmap_KxN, mel_K, diagonal(ham, sigma_N).astype(dtype)


def connected_moves(ham: Hamiltonian, sigma_N):
    """The connected configurations as moves, in the order of `connected`'s elements: a list
    of (sites_KxJ, delta_KxJ) groups, the K moves of a group each flipping J spins (the
    single flips of the field, then the pair flips of the exchange), delta = new - old = +-2.
    Empty groups are left out."""
    groups = [ham.x_sites[:, None], ham.xy_bonds]
    return [(jnp.asarray(sites, jnp.int32), -2 * sigma_N[sites]) for sites in groups if len(sites)]


def local_energy(ham: Hamiltonian, logpsi_fn, params, sigma_N, ratio_fn=None):
    """E_loc(s) = sum_s' <s|H|s'> psi(s') / psi(s) for one configuration.

    Args:
        ham: the Hamiltonian.
        logpsi_fn: (params, sigma_xN) -> log psi [...], batched over leading axes.
        params: model parameters.
        sigma_N: spins [N].
        ratio_fn: optional (params, sigma_N, sites_KxJ, delta_KxJ) -> psi(s'_k) / psi(s) for
            each group of moves of `connected_moves`, for models that update cheaply.

    Returns:
        A scalar, complex when log psi is complex.
    """
    sigmap_KxN, mel_K, diag = connected(ham, sigma_N)
    if ratio_fn is None:
        ratio_K = jnp.exp(logpsi_fn(params, sigmap_KxN) - logpsi_fn(params, sigma_N))
    else:
        ratio_K = jnp.concatenate([ratio_fn(params, sigma_N, *move) for move in connected_moves(ham, sigma_N)])
    return diag + jnp.sum(mel_K * ratio_K)


def to_sparse(ham: Hamiltonian, states: np.ndarray):
    """The Hamiltonian as a scipy CSR matrix on the basis `states` [D, N] (int8 +-1).

    Connected configurations outside the basis must have zero element (true for the
    Sz-conserving exchange within an Sz sector).
    """
    import scipy.sparse as sp

    from runner.hilbert import states_to_codes

    states = np.asarray(states, np.int8)
    d, n = states.shape
    codes = states_to_codes(states)
    order = np.argsort(codes)
    sorted_codes = codes[order]
    i, j = ham.zz_bonds[:, 0], ham.zz_bonds[:, 1]
    diag = (states[:, i] * states[:, j]).astype(np.float64) @ ham.zz_coef
    rows, cols, vals = [np.arange(d)], [np.arange(d)], [diag]
    for k, mask in enumerate(flip_masks(ham, n)):
        if k < len(ham.x_sites):
            mel = np.full(d, ham.x_coef[k])
        else:
            a, b = ham.xy_bonds[k - len(ham.x_sites)]
            mel = ham.xy_coef[k - len(ham.x_sites)] * (states[:, a] != states[:, b])
        keep = mel != 0
        target = states_to_codes(states[keep] * mask)
        pos = np.searchsorted(sorted_codes, target)
        pos = np.minimum(pos, d - 1)
        if not np.all(sorted_codes[pos] == target):
            raise ValueError("connected configuration outside the basis")
        rows.append(np.nonzero(keep)[0])
        cols.append(order[pos])
        vals.append(mel[keep])
    return sp.csr_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(d, d)
    )
