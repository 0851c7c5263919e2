"""The `task` group: what a run does (find a ground state, evolve a state in time, or find the
lowest states), read and checked into plain values before anything compiles."""

import dataclasses

from runner.core import integrators
from runner.core.tdvp import TDVP, tdvp
from runner.errors import ConfigError, require_choice, require_int, require_number

GROUND_STATE, DYNAMICS, EXCITED = "ground_state", "dynamics", "excited"
INTEGRATORS = ("euler", "heun", "rk4", "rk23", "rk45")
ADAPTIVE = ("rk23", "rk45")
PROPAGATIONS = ("real", "imaginary")
INITIAL_STATES = ("plus_x", "init_from")
DYNAMICS_KEYS = ("name", "t_end", "dt", "integrator", "atol", "rtol", "dt_min", "dt_max", "save_every",
                 "propagation", "diag_shift", "rcond", "snr_cutoff", "initial_state", "measure_rounds")
EXCITED_KEYS = ("name", "n_states")


@dataclasses.dataclass(frozen=True)
class GroundState:
    """The ground state of the run's Hamiltonian, found by VMC (n_iter steps of optimizer and preconditioner)."""


@dataclasses.dataclass(frozen=True)
class Excited:
    """The n_states lowest states of the model's space or sector, trained together (natural excited states)."""

    n_states: int


@dataclasses.dataclass(frozen=True)
class Dynamics:
    """A time evolution: integrate the TDVP from the initial state to t_end, measuring every save_every."""

    t_end: float
    save_every: float
    integrator: integrators.Integrator
    equation: TDVP
    initial_state: str  # plus_x | init_from
    measure_rounds: int  # draws of n_samples per saved time's measurement

    @property
    def real_time(self) -> bool:
        return self.equation.real_time

    def save_times(self) -> list[float]:
        """The saved times: 0, save_every, 2 save_every, ... and t_end (each a product k * save_every,
        never a running sum, so a longer run passes through the same times)."""
        times, k = [0.0], 1
        while k * self.save_every < self.t_end * (1 - 1e-12):
            times.append(k * self.save_every)
            k += 1
        if self.t_end > 0:
            times.append(self.t_end)
        return times


def _integrator(node: dict) -> integrators.Integrator:
    name = require_choice("task.integrator", node.get("integrator"), INTEGRATORS)
    dt = node.get("dt")
    try:
        if name in ADAPTIVE:
            return getattr(integrators, name)(dt, atol=node.get("atol"), rtol=node.get("rtol"),
                                              dt_min=node.get("dt_min"), dt_max=node.get("dt_max"))
        return getattr(integrators, name)(dt)
    except ConfigError as err:
        raise ConfigError(f"task.{err.key}", err.message) from None


def read(node) -> GroundState | Dynamics | Excited:
    """The task of a config's `task` node: a `GroundState` (the default, also when the node is
    missing: a run directory written before tasks existed), or a checked `Dynamics` or `Excited`.

    Raises:
        ConfigError: naming the first bad `task.key`.
    """
    if node is None:
        return GroundState()
    if not isinstance(node, dict):
        raise ConfigError("task", f"must be a config group such as task=dynamics (got {node!r})")
    name = require_choice("task.name", node.get("name"), (GROUND_STATE, DYNAMICS, EXCITED))
    if name == GROUND_STATE:
        extra = sorted(set(node) - {"name"})
        if extra:
            raise ConfigError(f"task.{extra[0]}", "is not a key of task=ground_state")
        return GroundState()
    if name == EXCITED:
        unknown = sorted(set(node) - set(EXCITED_KEYS))
        if unknown:
            raise ConfigError(f"task.{unknown[0]}", f"is not a key of task=excited; its keys are: {', '.join(EXCITED_KEYS)}")
        return Excited(require_int("task.n_states", node.get("n_states"), minimum=1))
    unknown = sorted(set(node) - set(DYNAMICS_KEYS))
    if unknown:
        raise ConfigError(f"task.{unknown[0]}", f"is not a key of task=dynamics; its keys are: {', '.join(DYNAMICS_KEYS)}")
    t_end = require_number("task.t_end", node.get("t_end"), nonnegative=True)
    save_every = require_number("task.save_every", node.get("save_every"), positive=True)
    integrator = _integrator(node)
    propagation = require_choice("task.propagation", node.get("propagation"), PROPAGATIONS)
    try:
        equation = tdvp(real_time=propagation == "real", diag_shift=node.get("diag_shift"), rcond=node.get("rcond"),
                        snr_cutoff=node.get("snr_cutoff"))
    except ConfigError as err:
        raise ConfigError(f"task.{err.key}", err.message) from None
    initial_state = require_choice("task.initial_state", node.get("initial_state"), INITIAL_STATES)
    rounds = node.get("measure_rounds")  # null (and a run directory from before the key): one draw
    measure_rounds = 1 if rounds is None else require_int("task.measure_rounds", rounds, minimum=1)
    return Dynamics(t_end, save_every, integrator, equation, initial_state, measure_rounds)


def is_default(node) -> bool:
    """Whether a config's `task` node is the default ground-state task (left out of fingerprints,
    so runs from before tasks existed keep theirs)."""
    return node is None or node == {"name": GROUND_STATE}
