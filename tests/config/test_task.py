"""The task group: ground_state leaves the fingerprint as it was, dynamics composes and builds, and
each bad value is a ConfigError naming its key (the plus_x check of a model: tests/lifecycle/test_dynamics.py)."""

import pytest

from runner.config import fingerprint
from runner.config.build import build, instantiate
from runner.config.task import Excited, GroundState, read, upgraded, upgraded_overrides
from runner.core import integrators
from runner.errors import ConfigError
from tests.helpers.cli import run_cli
from tests.helpers.config import compose_config


def test_ground_state_is_the_default_and_leaves_the_fingerprint_unchanged():
    config = compose_config()
    assert config["task"] == {"name": "ground_state"}
    assert build(config).settings.task == GroundState()
    flat = fingerprint.of(config)
    assert not [k for k in flat if k.startswith("task")]
    without = {k: v for k, v in config.items() if k != "task"}  # a run directory from before tasks existed
    assert fingerprint.digest(fingerprint.of(without)) == fingerprint.digest(flat)
    assert fingerprint.digest(fingerprint.of(compose_config(["task=dynamics"]))) != fingerprint.digest(flat)


@pytest.mark.parametrize("integrator", ["euler", "heun", "rk4", "rk23", "rk45"])
def test_dynamics_composes_and_builds(integrator):
    task = build(compose_config(["task=dynamics", f"task/integrator={integrator}"])).settings.task
    assert task.integrator.tableau is getattr(integrators, integrator.upper())
    assert (task.integrator.controller is not None) == (integrator in ("rk23", "rk45"))
    assert task.real_time and task.initial_state == "plus_x"


def test_save_times_are_multiples_of_save_every_and_end_at_t_end():
    task = read({**compose_config(["task=dynamics"])["task"], "t_end": 0.35, "save_every": 0.1}, instantiate)
    assert task.save_times() == [0.0, 0.1, 0.2, 0.1 * 3, 0.35]
    assert read({**compose_config(["task=dynamics"])["task"], "t_end": 0.0}, instantiate).save_times() == [0.0]


@pytest.mark.parametrize("override,key", [
    ("task.integrator.dt=0", "task.integrator.dt"),
    ("task.integrator.dt=-0.1", "task.integrator.dt"),
    ("task.t_end=-1", "task.t_end"),
    ("task.equation.real_time=sometimes", "task.equation.real_time"),
    ("task.save_every=0", "task.save_every"),
    ("task.initial_state=neel", "task.initial_state"),
    ("task.initial_state=init_from", "task.initial_state"),
    ("task.equation.rcond=2", "task.equation.rcond"),
    ("task.equation.diag_shift=-1", "task.equation.diag_shift"),
    ("task.equation.snr_cutoff=-1", "task.equation.snr_cutoff"),
    ("task.measure_rounds=0", "task.measure_rounds"),
    ("+task.typo=1", "task.typo"),
    ("+task.integrator.typo=1", "task.integrator.typo"),
    ("+task.equation.typo=1", "task.equation.typo"),
])
def test_bad_values_name_their_key(override, key):
    with pytest.raises(ConfigError) as err:
        build(compose_config(["task=dynamics", override]))
    assert err.value.key == key


def test_adaptive_bounds_are_checked():
    with pytest.raises(ConfigError, match="task.integrator.dt_min"):
        build(compose_config(["task=dynamics", "task/integrator=rk45", "task.integrator.dt_min=1",
                                    "task.integrator.dt_max=0.5"]))


@pytest.mark.parametrize("override,key,match", [
    ("task.integrator=rk45", "task.integrator", "choose its option with task/integrator=OPTION"),
    ("task/integrator=leapfrog", "task/integrator=leapfrog", "is not an option"),
    ("task.dt=0.1", "task.dt", "it is task.integrator.dt now"),
    ("task.propagation=imaginary", "task.propagation", "it is task.equation.real_time now"),
    ("task.integrator.atol=1", "task.integrator.atol", "not a key of task/integrator=rk4; valid names: dt"),
])
def test_the_command_line_is_checked_against_the_nodes(override, key, match):
    from runner.config.compose import compose

    with pytest.raises(ConfigError, match=match) as err:
        compose(["task=dynamics", override])
    assert err.value.key == key


def test_a_key_the_constructor_lacks_is_refused_with_its_removal():
    with pytest.raises(ConfigError, match=r"is not a key of task.integrator; its keys are: dt .*~task.integrator.atol"):
        build(compose_config(["task=dynamics", "+task.integrator.atol=1"]))


OLD_NODE = {"name": "dynamics", "t_end": 0.2, "dt": 0.02, "integrator": "rk23", "atol": 1e-4, "rtol": 1e-5,
            "dt_min": 1e-6, "dt_max": 0.1, "save_every": 0.1, "measure_rounds": None, "propagation": "imaginary",
            "diag_shift": 0.1, "rcond": 1e-6, "snr_cutoff": 2.0, "initial_state": "plus_x"}
OLD_OVERRIDES = ["task=dynamics", "task.t_end=0.2", "task.save_every=0.1", "task.integrator=rk23", "task.dt=0.02",
                 "task.atol=1e-4", "task.rtol=1e-5", "task.propagation=imaginary", "task.diag_shift=0.1",
                 "task.rcond=1e-6", "task.snr_cutoff=2.0"]


def test_a_node_of_the_flat_spelling_builds_the_same_task():
    """A run directory written when task=dynamics had flat keys (integrator: rk23, dt, propagation, ...)."""
    today = compose_config(upgraded_overrides(OLD_OVERRIDES))["task"]
    assert upgraded(OLD_NODE) == today
    assert upgraded(today) == today
    assert read(upgraded(OLD_NODE), instantiate) == read(today, instantiate)
    fixed = upgraded({**OLD_NODE, "integrator": "rk4", "propagation": "real"})
    assert fixed["integrator"] == {"_target_": "runner.core.integrators.rk4", "dt": 0.02}  # rk4 never read atol
    assert fixed["equation"]["real_time"] is True


def test_old_overrides_read_in_todays_spelling():
    assert upgraded_overrides(OLD_OVERRIDES) == [
        "task=dynamics", "task.t_end=0.2", "task.save_every=0.1", "task/integrator=rk23", "task.integrator.dt=0.02",
        "task.integrator.atol=1e-4", "task.integrator.rtol=1e-5", "task.equation.real_time=false",
        "task.equation.diag_shift=0.1", "task.equation.rcond=1e-6", "task.equation.snr_cutoff=2.0"]
    assert upgraded_overrides(["task.dt=0.02", "task.atol=1e-4"]) == ["task.integrator.dt=0.02"]  # rk4: no atol


def test_cli_refuses_the_flat_spelling_in_one_sentence(tmp_path, repo):
    """task.dt (before the integrator was a node): exit 2 naming today's key, before a run directory exists."""
    proc = run_cli(["task=dynamics", "task.dt=0.02", f"hydra.run.dir={tmp_path / 'run'}"], cwd=repo)
    assert proc.returncode == 2, proc.stderr
    assert "Config error: task.dt is not a key of task=dynamics; it is task.integrator.dt now" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_cli_refuses_plus_x_for_a_model_that_cannot_be_uniform(tmp_path, repo):
    """An odd spin-flip parity projects the uniform state to zero: exit 2 with one sentence, before compiling."""
    proc = run_cli(["task=dynamics", "hilbert.L=4", "model=rbm_symm",
                    "model.sector={momentum: [0], irrep: \"A'\", parity: -1}", f"hydra.run.dir={tmp_path / 'run'}"],
                   cwd=repo)
    assert proc.returncode == 2, proc.stderr
    assert "Config error: task.initial_state is plus_x, which the model RBMSymm cannot represent" in proc.stderr


def test_excited_builds_the_problem_of_k_copies():
    """task=excited: the sampler on K copies of the space, sum_j H_j, the determinant of K states of
    the configured model; the experiment's own space and Hamiltonian stay the model's."""
    from models.determinant import Determinant
    from models.rbm import RBM

    experiment = build(compose_config(["task=excited", "task.n_states=3", "hilbert.L=4", "dtype=complex128"]))
    problem = experiment.problem
    assert experiment.settings.task == Excited(3)
    assert isinstance(problem.model, Determinant) and problem.model.n_states == 3
    assert isinstance(problem.model.base, RBM)
    assert problem.sampler.hilbert.n_sites == 12 and problem.sampler.hilbert.copies == 3
    assert problem.hamiltonian.n_sites == 12 and len(problem.hamiltonian.terms) == 3 * len(experiment.hamiltonian.terms)
    assert experiment.hilbert.n_sites == 4 and experiment.hamiltonian.n_sites == 4
    ground = build(compose_config(["hilbert.L=4", "dtype=complex128"]))
    assert ground.settings.task == GroundState() and ground.problem.sampler.hilbert.n_sites == 4


@pytest.mark.parametrize("overrides,key,match", [
    (["task.n_states=0"], "task.n_states", "at least 1"),
    (["task.n_states=1.5"], "task.n_states", "integer"),
    (["task.n_states=true"], "task.n_states", "integer"),
    (["+task.typo=1"], "task.typo", "not a key of task=excited"),
    (["task.n_states=17"], "task.n_states", "more than the 16 states the model's space holds"),
    (["hilbert.total_sz=0", "hamiltonian=heisenberg", "sampler=metropolis_exchange", "task.n_states=7"],
     "task.n_states", "more than the 6 states"),
    (["model=rbm_symm", "model.sector={momentum: [0], irrep: \"A'\", parity: -1}", "task.n_states=3"],
     "task.n_states", "more than the 2 states the model's sector"),
    (["sampler=full_sum"], "sampler", "zero wherever two copies coincide"),
    (["observables=spin", "observables.every=5"], "observables.every", "must be 0 with task=excited"),
])
def test_excited_refuses_impossible_requests(overrides, key, match):
    with pytest.raises(ConfigError, match=match) as err:
        build(compose_config(["task=excited", "hilbert.L=4", "dtype=complex128", *overrides]))
    assert err.value.key == key


def test_the_sector_capacity_is_its_dimension():
    """A sector's capacity is its dimension (dense projector rank), summing to the space's over every sector."""
    from runner.config.excited import capacity
    from runner.physics import hilbert as hb
    from runner.physics import symmetry

    space = hb.chain(4)
    listed = symmetry.sectors(space, parity=True, stars=False)
    dims = [capacity(space, s) for s in listed]
    assert sum(dims) == 16 and capacity(space, None) == 16
    assert capacity(hb.chain(4, total_sz=0), None) == 6


def test_a_real_model_asked_for_excited_states_is_warned_about(caplog):
    build(compose_config(["task=excited", "hilbert.L=4", "dtype=float64"]))
    assert "cannot represent excited states" in caplog.text
