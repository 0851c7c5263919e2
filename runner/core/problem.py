"""The static parts of a VMC run (`Problem`), the state it carries (`VMCState`), a step's samples."""

import dataclasses
from typing import Any, NamedTuple

import jax
import optax

from runner.core.full_sum import FullSumSampler
from runner.core.precond import Preconditioner
from runner.core.sampler import Amplitude, ChainState, sample, training_power
from runner.core.weights import full_sum_weights, importance_weights
from runner.core.wavefunction import amplitude_of, apply_model
from runner.physics.pauli import Hamiltonian


class VMCState(NamedTuple):
    """Everything a run needs to continue exactly: parameters, optimizer, chains, step."""

    params: Any
    opt_state: Any
    chains: ChainState
    step: jax.Array  # int32 scalar, number of completed VMC steps
    solver: Any  # the preconditioner's state (CG: warm start and deflation basis)
    guard: Any = ()  # a `Guard` with `Problem.reject_jump`, else ()


@dataclasses.dataclass(frozen=True)
class Problem:
    """The static parts of a VMC run (closed over by the jitted step).

    Attributes:
        hamiltonian: connected-element Hamiltonian.
        model: Flax module mapping spins [..., N] -> log psi [...].
        sampler: a sampler from `runner.core.sampler`.
        optimizer: an optax GradientTransformation.
        precondition: a `runner.core.precond.Preconditioner`.
        chunk_size: evaluate local energies, log-derivatives and SR's products with them
            (CG) on at most this many samples at a time (a multiple of n_chains), or None for
            all at once.
        clip_local_energy: for the gradient only, local energies farther than this many mean
            absolute deviations from their median are pulled back onto that distance
            (`stats.clip_outliers`); None: no clipping. The energy statistics use the raw values.
        learning_rate: the optimizer's learning-rate schedule (a function of the step, which
            optax reads from its own count: the VMC step, less two per step undone by
            `reject_jump`), reported in the metrics; None when the learning rate is a number.
        reject_jump: k: a step whose samples estimate the energy more than k combined error
            bars above the last accepted step's estimate is undone (`vmc_step`); None: off.
        recover: n (with reject_jump): a run that fails goes back to its last good checkpoint with
            the ceiling of the guard's step scale halved, at most n times
            (`runner.lifecycle.ground_state.recover`); 0: off (the guard holds no ceiling).
    """

    hamiltonian: Hamiltonian
    model: Any
    sampler: Any
    optimizer: optax.GradientTransformation
    precondition: Preconditioner
    chunk_size: int | None = None
    learning_rate: Any = None
    clip_local_energy: float | None = None
    reject_jump: float | None = None
    recover: int = 0

    def logpsi(self, params, sigma_xN):
        return apply_model(self.model, params, sigma_xN)

    @property
    def amplitude(self) -> Amplitude:
        return amplitude_of(self.model)

    @property
    def chunk_per_chain(self) -> int | None:
        if self.chunk_size is None:
            return None
        return max(1, self.chunk_size // self.sampler.n_chains)

    @property
    def per_chain_at_once(self) -> int | None:
        """Samples of each chain a step evaluates at once (its chunk, else all of them): how many
        an evaluation of more samples (every configuration of a full sum, a larger draw) takes at
        a time, so it fits in the memory the run's steps needed. None (all at once) without a sampler."""
        if self.chunk_per_chain is not None or self.sampler is None:
            return self.chunk_per_chain
        return max(1, self.sampler.n_samples // self.sampler.n_chains)


def sums_exactly(problem: Problem) -> bool:
    """Whether the problem's weights are a full sum's (exact), not importance weights."""
    return isinstance(problem.sampler, FullSumSampler)


def draw(problem: Problem, params, chains: ChainState):
    """(chains, sigma [C, T, N], w [C, T] or None, acceptance) for a training step: samples of
    |psi|^2 (w None); samples of |psi|^p with their importance weights |psi|^(2-p) for a
    sampler's `machine_pow` p != 2 (the rare configurations where |psi| is small, which the
    gradient needs to learn signs near nodes, are visited more); or a full sum's configurations
    and their exact weights."""
    power = training_power(problem.sampler)
    chains, sigma_CxTxN, acceptance = sample(problem.sampler, problem.amplitude, params, chains, power)
    if sums_exactly(problem):
        w_CxT = full_sum_weights(problem.sampler, problem.amplitude, params, sigma_CxTxN)
    elif power != 2.0:
        w_CxT = importance_weights(problem.sampler, problem.amplitude, params, sigma_CxTxN)
    else:
        w_CxT = None
    return chains, sigma_CxTxN, w_CxT, acceptance
