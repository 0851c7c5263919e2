"""K copies of a spin system side by side: the space of K configurations (x_1, ..., x_K) on which
natural excited states train one K-state determinant (`models.determinant`)."""

import numpy as np

from runner.errors import ConfigError
from runner.physics import pauli, space_group
from runner.physics.hilbert import Hilbert


def _shifted(n_sites: int, n_copies: int, sites) -> list:
    return [s + k * n_sites for k in range(n_copies) for s in sites]


def hamiltonian(ham: pauli.PauliSum, n_copies: int) -> pauli.PauliSum:
    """sum_j H_j on K N sites, H_j acting on the j-th copy (sites j N .. j N + N - 1)."""
    n = ham.n_sites
    terms = [(c, ops, tuple(s + k * n for s in sites)) for k in range(n_copies) for c, ops, sites in ham.terms]
    rotated = None if ham.rotated is None else _shifted(n, n_copies, ham.rotated)
    angles = None if ham.angles is None else ham.angles * n_copies
    return pauli.pauli_sum(n * n_copies, terms, rotated=rotated, angles=angles)


def hilbert(space: Hilbert, n_copies: int) -> Hilbert:
    """K copies of `space` as one space of K N sites: the bonds of each copy, no bond between
    copies (exchange moves keep each copy's Sz), no symmetry beyond the identity; a fixed
    total_sz holds in each copy."""
    if space.copies != 1:
        raise ConfigError("n_states", "copies of a space of copies are not supported")
    n = space.n_sites

    def shift(pairs):
        return np.concatenate([np.asarray(pairs, np.int32) + k * n for k in range(n_copies)]).reshape(-1, 2)

    identity = np.arange(n * n_copies, dtype=np.int32)[None, :]
    return Hilbert(
        n_sites=n * n_copies,
        bonds=shift(space.bonds),
        next_bonds=shift(space.next_bonds),
        sublattice=None if space.sublattice is None else np.tile(space.sublattice, n_copies),
        total_sz=space.total_sz,
        shape=(n * n_copies,),
        pbc=space.pbc,
        positions=np.tile(space.positions, (n_copies, 1)),
        translations=identity,
        momenta=np.zeros((1, space.positions.shape[1])),
        next_bonds_issue=space.next_bonds_issue,
        space_group=space_group.identity(n * n_copies, space.positions.shape[1]),
        copies=n_copies,
    )
