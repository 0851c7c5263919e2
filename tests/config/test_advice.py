"""Every suggestion of the sampler refusals works when followed: the config with the suggested
overrides added composes and builds (issue 56, item 8)."""

import re

import pytest

from runner import cli
from runner.config.build import build
from runner.errors import ConfigError
from tests.helpers.config import compose_config


def suggestions(message: str) -> list[list[str]]:
    """The alternatives after "use " in a refusal, each as its `key=value` overrides
    ("use a=1 b=2 or c=3" -> [["a=1", "b=2"], ["c=3"]])."""
    advice = message.partition("; use ")[2].partition(" (")[0]
    assert advice, f"no suggestion in: {message}"
    return [re.findall(r"[\w.]+=[\w.\-]+", alternative) for alternative in advice.split(" or ")]


def refusal(overrides) -> ConfigError:
    cli.check_overrides(overrides)
    with pytest.raises(ConfigError) as err:
        build(compose_config(overrides))
    return err.value


def followed(overrides, alternative):
    """The overrides with a suggestion applied (a suggested key replaces an override of it)."""
    keys = {a.partition("=")[0] for a in alternative}
    return [o for o in overrides if o.partition("=")[0] not in keys] + alternative


REFUSED = [
    # beyond the full sum's 2^16 states, with and without a fixed total_sz
    (["experiment=j1j2_square_full_sum", "hilbert.L=6"], "full_sum needs"),
    (["hilbert.L=20", "sampler=full_sum"], "full_sum needs"),
    (["hilbert.L=20", "hilbert.total_sz=0", "hamiltonian=heisenberg", "sampler=full_sum"], "full_sum needs"),
    (["hilbert.L=20", "sampler=exact"], "exact needs"),
    (["hilbert.L=20", "hilbert.total_sz=0", "hamiltonian=heisenberg", "sampler=exact"], "exact needs"),
    # metropolis_local with a fixed total_sz
    (["hilbert.total_sz=0", "hamiltonian=heisenberg"], "metropolis_local flips"),
]


@pytest.mark.parametrize("overrides,refused", REFUSED)
def test_each_suggestion_builds(overrides, refused):
    err = refusal(overrides)
    assert refused in str(err)
    alternatives = suggestions(str(err))
    for alternative in alternatives:
        assert alternative, f"a suggestion with no override to follow: {err}"
        config = compose_config(followed(overrides, alternative))
        build(config)  # a config error here: the advice leads nowhere


def test_full_sum_beyond_its_size_names_only_valid_samplers():
    # total_sz set: metropolis_local (refused with a fixed Sz) is not offered
    err = refusal(["experiment=j1j2_square_full_sum", "hilbert.L=6"])
    assert "metropolis_exchange" in str(err) and "metropolis_local" not in str(err)
    err = refusal(["hilbert.L=20", "sampler=full_sum"])  # no total_sz: exchange would be refused
    assert "metropolis_local" in str(err) and "metropolis_exchange" not in str(err)


@pytest.mark.parametrize("experiment", ["triangular_heisenberg", "j1j2_square_full_sum", "kagome_heisenberg",
                                        "j1j2_square_sector"])
def test_experiment_on_full_sum_switches_sampler(experiment):
    """An experiment that sums over orbits switches to a Markov chain by sampler= alone (its
    symmetry belongs to its sampler option, which the switch replaces)."""
    overrides = [f"experiment={experiment}", "sampler=metropolis_exchange"]
    cli.check_overrides(overrides)
    config = compose_config(overrides)
    assert "symmetry" not in config["sampler"]
    build(config)
    assert compose_config([f"experiment={experiment}"])["sampler"]["symmetry"] != "none"


def test_option_keys_follow_its_defaults():
    """sampler=full_sum_lattice extends full_sum: the CLI's key check knows full_sum's keys."""
    cli.check_overrides(["sampler=full_sum_lattice", "sampler.n_chains=4", "sampler.symmetry=translations"])
    cli.check_overrides(["experiment=triangular_heisenberg", "sampler.symmetry=none"])
    with pytest.raises(ConfigError, match="sampler.symetry"):
        cli.check_overrides(["sampler=full_sum_lattice", "sampler.symetry=none"])


def test_a_key_an_experiment_sets_for_another_option_says_how_to_remove_it():
    """j1j2_square_cnn sets sampler.machine_pow, which sampler=full_sum lacks: the sentence names the
    way out, and following it (~sampler.machine_pow, then the next sentences' clip_local_energy=null
    and reject_jump=null: the experiment's Monte Carlo stabilisers, each refused in turn) builds."""
    overrides = ["experiment=j1j2_square_cnn", "hilbert.L=4", "sampler=full_sum"]
    with pytest.raises(ConfigError, match=r"sampler\.machine_pow is not a key of sampler.*~sampler\.machine_pow removes it"):
        build(compose_config(overrides))
    followed = [*overrides, "~sampler.machine_pow"]
    with pytest.raises(ConfigError, match="^clip_local_energy must be null"):
        build(compose_config(followed))
    followed.append("clip_local_energy=null")
    with pytest.raises(ConfigError, match="^reject_jump must be null"):
        build(compose_config(followed))
    followed.append("reject_jump=null")
    cli.check_overrides(followed)
    assert build(compose_config(followed)).problem.sampler.n_samples > 0
