"""Which `runner.lifecycle.loop.Task` runs a config's task: the one place that tells the tasks apart."""

from runner.config.task import Dynamics, Excited, GroundState
from runner.lifecycle import dynamics, excited, ground_state, loop

TASKS = {GroundState: ground_state.TASK, Dynamics: dynamics.TASK, Excited: excited.TASK}


def of(task) -> loop.Task:
    """The task type of a config's task (`runner.config.task.read`'s value)."""
    return TASKS[type(task)]
