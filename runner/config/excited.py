"""task=excited in the build: the checks that need the model's space, and the problem of K copies
(the copies' space and Hamiltonian, `runner.physics.replicas`; the K-state determinant of the
model, `models.determinant`) that the ordinary VMC step trains."""

import dataclasses

from models.determinant import Determinant
from runner.config.task import Excited
from runner.core.problem import Problem
from runner.errors import ConfigError
from runner.physics import replicas, spectrum
from runner.physics.hilbert import Hilbert


def capacity(hilbert: Hilbert, sector) -> int:
    """How many states the model can hold: the dimension of its sector (`sector`), else the number
    of configurations of the space (its Sz sector, if any)."""
    if sector is None:
        return int(hilbert.n_states)
    return spectrum.sector_dimension(hilbert, sector)


def n_states_of(config: dict, the_task, hilbert: Hilbert, sector) -> int | None:
    """K of a task=excited run (None for another task), after refusing a full-sum sampler and more
    states than the model's space or sector holds.

    Raises:
        ConfigError: naming the key.
    """
    if not isinstance(the_task, Excited):
        return None
    n_states = the_task.n_states
    if str(config["sampler"].get("_target_", "")).endswith("full_sum"):
        raise ConfigError("sampler", "full_sum cannot sum over the K copies of task=excited (the determinant is "
                                     "exactly zero wherever two copies coincide, where the local matrix is "
                                     "undefined); use sampler=metropolis_local, metropolis_exchange or exact")
    held = capacity(hilbert, sector)
    if n_states > held:
        where = f"the model's sector {sector.name}" if sector is not None else "the model's space"
        raise ConfigError("task.n_states", f"is {n_states}, more than the {held} states {where} holds")
    return n_states


def sampled_space(hilbert: Hilbert, n_states: int | None) -> Hilbert:
    """The space the sampler draws from: K copies side by side with task=excited, else `hilbert`."""
    return hilbert if n_states is None else replicas.hilbert(hilbert, n_states)


def problem_of(problem: Problem, n_states: int | None, observables) -> Problem:
    """The problem of K copies: sum_j H_j, the determinant of K states of the model, and the sampler
    (built by the caller on `sampled_space`) left as it is; `problem` itself for another task.

    Raises:
        ConfigError: observables asked for during training (`every` > 0).
    """
    if n_states is None:
        return problem
    if observables is not None and observables.every > 0:
        raise ConfigError("observables.every", "must be 0 with task=excited (observables are measured in each state "
                                               "at the end of the run, not during training)")
    return dataclasses.replace(problem, hamiltonian=replicas.hamiltonian(problem.hamiltonian, n_states),
                               model=Determinant(base=problem.model, n_states=n_states))
