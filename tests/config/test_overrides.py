"""Overrides are checked against what Hydra composed (issue 57), by the one composition the CLI,
`runner.run` and `runner.evaluate` share (`runner.config.compose`): every experiment and each group it
chooses, an experiment that includes another, sweeps, additions and deletions as Hydra defines them."""

from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf

from runner import cli
from runner.config import compose
from runner.errors import ConfigError
from tests.helpers.cli import REPO, run_cli

CONF = Path(__file__).resolve().parents[2] / "conf"
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))


def test_an_experiment_that_includes_another_is_checked_against_its_model():
    """j1j2_square_excited includes j1j2_square, which chooses model=rbm_symm: model.group is a key."""
    cfg, choices = compose.composed(["experiment=j1j2_square_excited"])
    assert choices["model"] == "rbm_symm" and "group" in cfg["model"]
    cli.check_overrides(["experiment=j1j2_square_excited", "model.group=sector"])
    assert compose.compose(["experiment=j1j2_square_excited", "model.group=sector"])["model"]["group"] == "sector"
    with pytest.raises(ConfigError) as info:
        cli.check_overrides(["experiment=j1j2_square_excited", "model.groop=sector"])
    assert str(info.value) == "model.groop is not a key of model=rbm_symm; did you mean group?"


def _value(value) -> str:
    """A composed value as the value of a Hydra override."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_value(v) for v in value) + "]"
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def _a_key(node: dict) -> str:
    """A key of a composed group: the first with a plain value, else the first."""
    plain = [k for k, v in node.items() if isinstance(v, (bool, int, float)) or
             (isinstance(v, str) and "${" not in v and v != "???")]
    return (plain or list(node))[0]


def _one_sentence(message: str) -> bool:
    return "\n" not in message and message[-1] in ".?" and ". " not in message.rstrip(".")


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_group_of_every_experiment_takes_its_keys_and_refuses_others(experiment):
    """For each group the experiment composes, `group.KEY=<its value>` is accepted (and composes to
    that value) and `group.nosuchkey=1` is refused in one sentence naming the option composed."""
    chosen = [f"experiment={experiment}"]
    cfg, choices = compose.composed(chosen)
    accepted, expected = [], {}
    for group, option in choices.items():
        node = cfg.get(group) if group in cfg else None
        label = f"[{','.join(option)}]" if isinstance(option, list) else option
        with pytest.raises(ConfigError) as info:
            compose.check_key(f"{group}.nosuchkey", cfg, choices)
        message = str(info.value)
        assert _one_sentence(message), message
        if not isinstance(node, DictConfig):  # no option (debug: null), or one in the global package
            assert message.startswith(f"{group}.nosuchkey is not a key"), message
            continue
        assert message.startswith(f"{group}.nosuchkey is not a key of {group}={label}; "), message
        values = OmegaConf.to_container(node, resolve=False)
        if values:
            key = _a_key(values)
            accepted.append(f"{group}.{key}={_value(values[key])}")
            expected[(group, key)] = values[key]
    assert {"model", "hilbert", "hamiltonian", "sampler"} <= {group for group, _ in expected}
    again = compose.compose([*chosen, *accepted])  # checked as the CLI checks them, then composed
    for (group, key), value in expected.items():
        assert OmegaConf.to_container(again[group], resolve=False)[key] == value, (group, key)
    first = next(group for group, _ in expected)
    with pytest.raises(ConfigError, match=f"^{first}.nosuchkey is not a key of {first}="):
        cli.check_overrides([*chosen, *accepted, f"{first}.nosuchkey=1"])


def test_a_sweep_checks_every_option_it_composes():
    cli.check_overrides(["-m", "model=rbm,rbm_symm", "model.alpha=2", "hamiltonian.h=0.5,1.0"])
    with pytest.raises(ConfigError, match="^model.alpha is not a key of model=cnn; "):
        cli.check_overrides(["-m", "model=rbm,cnn", "model.alpha=2"])
    with pytest.raises(ConfigError, match=r"^model=nope is not an option; choose one of: cnn, "):
        cli.check_overrides(["-m", "model=rbm,nope"])
    cli.check_overrides(["logger=[jsonl,tensorboard]", "logger.tensorboard.flush_secs=3"])
    with pytest.raises(ConfigError, match=r"^logger.tensorboard is not a key of logger=\[jsonl\]; "):
        cli.check_overrides(["logger.tensorboard.flush_secs=3"])


def test_additions_and_deletions_are_hydras():
    """`+key=` adds a key (then settable), `++key=` sets or adds, `~key` deletes (then not settable)."""
    cli.check_overrides(["+model.extra=1", "model.extra=2"])
    assert compose.compose(["+model.extra=1", "model.extra=2"])["model"]["extra"] == 2
    assert compose.compose(["++model.alpha=3"])["model"]["alpha"] == 3
    assert "alpha" not in compose.compose(["~model.alpha"])["model"]
    with pytest.raises(ConfigError, match="^model.alpha is not a key of model=rbm; "):
        cli.check_overrides(["~model.alpha", "model.alpha=2"])
    with pytest.raises(ConfigError, match="^overrides cannot be composed"):
        cli.check_overrides(["~model.nosuchkey", "model.alpha=2"])
    with pytest.raises(ConfigError, match="^overrides cannot be composed"):
        compose.compose(["+model.alpha=3"])  # already there: Hydra's `++` would replace it


def test_top_level_keys_and_global_groups():
    cli.check_overrides(["n_iter=3", "hydra.run.dir=/tmp/x", "hydra/launcher=basic"])
    with pytest.raises(ConfigError, match="^n_itr is not a config group or top-level key; did you mean n_iter"):
        cli.check_overrides(["n_itr=3"])
    with pytest.raises(ConfigError, match=r"^experiment.n_iter is not a key of experiment=tfim1d, which sets"):
        cli.check_overrides(["experiment=tfim1d", "experiment.n_iter=3"])
    with pytest.raises(ConfigError, match=r"^debug.n_iter is not a key; no debug option is chosen\.$"):
        cli.check_overrides(["debug.n_iter=3"])


def test_runner_run_and_evaluate_refuse_by_the_same_composition(tmp_path):
    import runner
    from runner import evaluate
    from runner.lifecycle import rundir

    with pytest.raises(ConfigError, match="^model.groop is not a key of model=rbm_symm; did you mean group"):
        runner.run(["experiment=j1j2_square_excited", "model.groop=sector"], run_dir=tmp_path / "run", quiet=True)
    assert not (tmp_path / "run").exists()
    run_dir = tmp_path / "trained"  # a run's record of its composition: all compose_config reads
    (run_dir / rundir.HYDRA).mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(["experiment=j1j2_square_excited"]), run_dir / rundir.OVERRIDES)
    OmegaConf.save(compose.compose(["experiment=j1j2_square_excited"]), run_dir / rundir.CONFIG, resolve=True)
    assert evaluate.compose_config(run_dir, ["sampler.n_samples=64"])["sampler"]["n_samples"] == 64
    with pytest.raises(ConfigError, match="^sampler.n_sample is not a key of sampler=metropolis_exchange; did you"):
        evaluate.compose_config(run_dir, ["sampler.n_sample=64"])


def test_the_cli_refuses_before_anything_runs(tmp_path):
    proc = run_cli(["experiment=j1j2_square_excited", "model.groop=sector", f"hydra.run.dir={tmp_path / 'run'}"],
                   REPO, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and lines == [
        "Config error: model.groop is not a key of model=rbm_symm; did you mean group?"], proc.stderr
    assert not (tmp_path / "run").exists()
