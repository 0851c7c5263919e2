"""Every option of every config group composes and builds; bad values name their key."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from runner.config.build import GROUPS, build
from runner.errors import ConfigError

CONF = Path(__file__).resolve().parents[2] / "conf"

# Options that need a compatible choice elsewhere to make a valid experiment.
COMPANIONS = {
    "hilbert": {"square": ["hilbert.L=3"]},
    "hamiltonian": {"heisenberg": ["hilbert.total_sz=0", "sampler=metropolis_exchange"]},
    "sampler": {"metropolis_exchange": ["hilbert.total_sz=0", "hamiltonian=heisenberg"]},
}


def compose_config(overrides=()):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=True)


def all_options():
    for group in GROUPS:
        for path in sorted((CONF / group).glob("*.yaml")):
            yield group, path.stem


@pytest.mark.parametrize("group,option", list(all_options()))
def test_every_option_composes_and_builds(group, option):
    overrides = [f"{group}={option}", *COMPANIONS.get(group, {}).get(option, [])]
    config = compose_config(overrides)
    experiment = build(config)
    if option == "full_sum":  # every configuration of the space, on rows padded to whole chains
        assert experiment.problem.sampler.n_configurations == experiment.hilbert.n_states
    else:
        assert experiment.problem.sampler.n_samples == config["sampler"]["n_samples"]


def test_every_group_has_options():
    for group in GROUPS:
        assert list((CONF / group).glob("*.yaml")), group


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["sampler.n_samples=1000", "sampler.n_chains=16"], "sampler.n_samples"),
        (["sampler.n_chains=-4"], "sampler.n_chains"),
        (["hilbert.L=-3"], "hilbert.L"),
        (["hilbert.L=abc"], "hilbert.L"),
        (["hilbert.total_sz=0", "hamiltonian=heisenberg", "sampler=metropolis_exchange", "hilbert.L=5"], "hilbert.total_sz"),
        (["model.alpha=0"], "model.alpha"),
        (["model.alpha=-1"], "model.alpha"),
        (["model=mlp", "model.hidden=[0]"], "model.hidden"),
        (["preconditioner.diag_shift=-0.1"], "preconditioner.diag_shift"),
        (["preconditioner.solver=qr"], "preconditioner.solver"),
        (["preconditioner=minsr", "preconditioner.param_chunk_size=0"], "preconditioner.param_chunk_size"),
        (["preconditioner=minsr", "preconditioner.param_chunk_size=1.5"], "preconditioner.param_chunk_size"),
        (["n_iter=-1"], "n_iter"),
        (["n_iter=ten"], "n_iter"),
        (["seed=1.5"], "seed"),
        (["exact=maybe"], "exact"),
        (["optimizer.learning_rate=-0.1"], "optimizer.learning_rate"),
        (["chunk_size=100"], "chunk_size"),
        (["sampler.sweep_size=0"], "sampler.sweep_size"),
        (["hamiltonian.h=.inf"], "hamiltonian.h"),
        (["+model.beta=2"], "model.beta"),
        (["+model.param_dtype=float32"], "model.param_dtype"),  # the runner passes it from the dtype group
        (["+hamiltonian.hilbert=3"], "hamiltonian.hilbert"),
        (["optimizer=adam", "+optimizer.mu_dtype=foo"], "optimizer"),  # optax.adam raises TypeError
        (["sampler=metropolis_exchange"], "sampler"),
        (["hilbert.total_sz=0"], "hilbert.total_sz"),
        (["+n_iters=5"], "n_iters"),  # a typo of a top-level key
        (["+dtype.precision=32"], "dtype.precision"),
    ],
)
def test_bad_values_name_their_key(overrides, key):
    with pytest.raises(ConfigError) as info:
        build(compose_config(overrides))
    sentence = info.value.sentence()
    assert sentence.startswith(key), sentence
    assert "\n" not in sentence
