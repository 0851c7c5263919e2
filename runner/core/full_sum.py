"""The full sum's configurations: every configuration of a small space, or one per symmetry orbit.

Laid out like chains, each with its orbit's size; the constructor is `runner.core.sampler.full_sum`.
"""

import dataclasses

import numpy as np

from runner.physics.hilbert import Hilbert, states_to_codes
from runner.physics.space_group import SUBGROUPS

FULL_SUM_SYMMETRIES = SUBGROUPS  # sampler.symmetry names a group of the lattice's space group


@dataclasses.dataclass(frozen=True, eq=False)
class FullSumSampler:
    """Not a sampler: every configuration of the space, each weighted by its exact |psi|^2, so
    every expectation value is a sum, not an estimate (no statistical error).

    With a `symmetry` group under which |psi|, log psi's derivatives and H are invariant (H checked
    when the run is built, `runner.config.build`, the model when it starts,
    `runner.core.vmc.full_sum_invariance_error`), one configuration per orbit stands for the whole
    orbit, weighted by the orbit's size.

    Attributes:
        hilbert: the space summed over.
        n_chains: rows of the [C, T] layout (sharded over devices like chains); the
            configurations are spread over them in order, the last ones padded with weight 0.
        symmetry: none | translations | lattice.
        sigma_CxTxN: int8, the configurations (orbit representatives), padded.
        log_size_CxT: log of each one's orbit size (0 without symmetry), -inf for padding.
    """

    hilbert: Hilbert
    n_chains: int
    symmetry: str
    sigma_CxTxN: np.ndarray
    log_size_CxT: np.ndarray

    @property
    def n_configurations(self) -> int:
        """The configurations summed over (orbits with a symmetry): the rows that are not padding."""
        return int(np.isfinite(self.log_size_CxT).sum())

    @property
    def n_samples(self) -> int:
        """Rows of the layout, padding included (what the VMC core iterates over)."""
        return self.sigma_CxTxN.shape[0] * self.sigma_CxTxN.shape[1]

    @property
    def samples_per_chain(self) -> int:
        return self.sigma_CxTxN.shape[1]


def symmetry_group(hilbert: Hilbert, symmetry: str) -> np.ndarray:
    """int32 [G, N] the site permutations of `symmetry` (`SUBGROUPS`; none: the identity), read
    from the space group `hilbert` carries."""
    if hilbert.space_group is None:
        return np.arange(hilbert.n_sites, dtype=np.int32)[None]
    return hilbert.space_group.rows(symmetry)


def orbits(states_DxN: np.ndarray, group_GxN: np.ndarray):
    """(one configuration per orbit of the group [O, N], the orbits' sizes [O]), in the order of
    each orbit's first member in `states_DxN` (which must be closed under the group)."""
    canonical_D = np.min(np.stack([states_to_codes(states_DxN[:, g]) for g in group_GxN]), axis=0)
    _, first_O, size_O = np.unique(canonical_D, return_index=True, return_counts=True)
    order = np.argsort(first_O)
    return states_DxN[first_O[order]], size_O[order]
