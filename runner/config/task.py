"""The `task` group: what a run does (find a ground state, evolve a state in time, or find the
lowest states), read and checked into plain values before anything compiles."""

import dataclasses

from runner.core import integrators, ptvmc
from runner.core.tdvp import TDVP
from runner.errors import ConfigError, require_choice, require_int, require_number

GROUND_STATE, DYNAMICS, EXCITED = "ground_state", "dynamics", "excited"
ADAPTIVE = ("rk23", "rk45")  # the integrators with step control (conf/task/integrator/)
INITIAL_STATES = ("plus_x", "init_from")


@dataclasses.dataclass(frozen=True)
class GroundState:
    """The ground state of the run's Hamiltonian, found by VMC (n_iter steps of optimizer and preconditioner)."""


@dataclasses.dataclass(frozen=True)
class Excited:
    """The n_states lowest states of the model's space or sector, trained together (natural excited states)."""

    n_states: int


@dataclasses.dataclass(frozen=True)
class Dynamics:
    """A time evolution: integrate the TDVP (or take projected tVMC's steps) from the initial state to
    t_end, measuring every save_every."""

    t_end: float
    save_every: float
    integrator: integrators.Integrator | ptvmc.PTVMC  # ptVMC: the equation serves the measured residual only
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


# Each task's keys: `name` and its type's fields (the constructor's arguments).
TYPES = {GROUND_STATE: GroundState, DYNAMICS: Dynamics, EXCITED: Excited}
NODES = ("integrator", "equation")  # the keys of task=dynamics that are `_target_` nodes
# The keys of task=dynamics before the integrator and the equation of motion were nodes, with today's.
FLAT_KEYS = {"dt": "integrator.dt", "atol": "integrator.atol", "rtol": "integrator.rtol",
             "dt_min": "integrator.dt_min", "dt_max": "integrator.dt_max", "integrator": "task/integrator",
             "propagation": "equation.real_time", "diag_shift": "equation.diag_shift", "rcond": "equation.rcond",
             "snr_cutoff": "equation.snr_cutoff"}
_ADAPTIVE_KEYS = ("atol", "rtol", "dt_min", "dt_max")


def read(node, instantiate) -> GroundState | Dynamics | Excited:
    """The task of a config's `task` node: a `GroundState` (the default, also when the node is
    missing: a run directory written before tasks existed), or a checked `Dynamics` (its
    `integrator` and `equation` nodes built by `instantiate(group, node)`, runner.config.build's)
    or `Excited`.

    Raises:
        ConfigError: naming the first bad `task.key`.
    """
    if node is None:
        return GroundState()
    if not isinstance(node, dict):
        raise ConfigError("task", f"must be a config group such as task=dynamics (got {node!r})")
    name = require_choice("task.name", node.get("name"), (GROUND_STATE, DYNAMICS, EXCITED))
    keys = ("name", *(f.name for f in dataclasses.fields(TYPES[name])))
    unknown = sorted(set(node) - set(keys))
    if unknown:
        instead = f"task.{FLAT_KEYS[unknown[0]].replace('task/', '')}" if name == DYNAMICS and unknown[0] in FLAT_KEYS else None
        hint = f"it is {instead} now" if instead else f"its keys are: {', '.join(keys)}"
        raise ConfigError(f"task.{unknown[0]}", f"is not a key of task={name}; {hint} (~task.{unknown[0]} removes it)")
    if name == GROUND_STATE:
        return GroundState()
    if name == EXCITED:
        return Excited(require_int("task.n_states", node.get("n_states"), minimum=1))
    t_end = require_number("task.t_end", node.get("t_end"), nonnegative=True)
    save_every = require_number("task.save_every", node.get("save_every"), positive=True)
    built = {}
    for key in NODES:
        if not isinstance(node.get(key), dict):
            raise ConfigError(f"task.{key}", f"must be a node with a _target_ (got {node.get(key)!r})"
                              + ("; choose the integrator with task/integrator=NAME" if key == "integrator" else ""))
        built[key] = instantiate(f"task.{key}", node[key])
    initial_state = require_choice("task.initial_state", node.get("initial_state"), INITIAL_STATES)
    rounds = node.get("measure_rounds")  # null (and a run directory from before the key): one draw
    measure_rounds = 1 if rounds is None else require_int("task.measure_rounds", rounds, minimum=1)
    return Dynamics(t_end, save_every, built["integrator"], built["equation"], initial_state, measure_rounds)


def upgraded(node):
    """A stored run's `task` node in today's spelling: a dynamics node written before the integrator
    and the equation of motion were `_target_` nodes (flat `integrator: rk4`, `dt`, `propagation`,
    ...) as those nodes, the adaptive keys kept for the adaptive integrators only (the fixed-step
    ones never read them); any other node as it is."""
    if not (isinstance(node, dict) and node.get("name") == DYNAMICS and isinstance(node.get("integrator"), str)):
        return node
    name = node["integrator"]
    integrator = {"_target_": f"runner.core.integrators.{name}", "dt": node.get("dt")}
    if name in ADAPTIVE:
        integrator.update({k: node.get(k) for k in _ADAPTIVE_KEYS})
    equation = {"_target_": "runner.core.tdvp.tdvp", "real_time": node.get("propagation", "real") == "real",
                **{k: node.get(k) for k in ("diag_shift", "rcond", "snr_cutoff") if k in node}}
    out = {k: v for k, v in node.items() if k not in FLAT_KEYS}
    return {**out, "integrator": integrator, "equation": equation}


def upgraded_overrides(lines: list[str]) -> list[str]:
    """A stored run's command-line overrides of `task` keys (`upgraded`'s old spelling) in today's:
    `task.integrator=rk23` as `task/integrator=rk23`, `task.dt=0.02` as `task.integrator.dt=0.02`,
    `task.propagation=imaginary` as `task.equation.real_time=false`; an adaptive key left out unless
    the lines choose an adaptive integrator."""
    choices = [line.partition("=")[2] for line in lines if line.startswith("task.integrator=")]
    adaptive = bool(choices) and choices[-1] in ADAPTIVE
    out = []
    for line in lines:
        key, _, value = line.partition("=")
        old = key.removeprefix("task.") if key.startswith("task.") else None
        if old not in FLAT_KEYS:
            out.append(line)
        elif old == "propagation":
            out.append(f"task.equation.real_time={str(value == 'real').lower()}")
        elif old not in _ADAPTIVE_KEYS or adaptive:
            new = FLAT_KEYS[old]
            out.append(f"{new}={value}" if new.startswith("task/") else f"task.{new}={value}")
    return out


def is_default(node) -> bool:
    """Whether a config's `task` node is the default ground-state task (left out of fingerprints,
    so runs from before tasks existed keep theirs)."""
    return node is None or node == {"name": GROUND_STATE}
