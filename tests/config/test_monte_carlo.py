"""A recipe's `monte_carlo` set-up (runner.config.monte_carlo, conf/monte_carlo/): the named lattice recipes run
their own set-up where the full sum fits and the CNN set-up beyond it, one command at every size; a command-line
key the set-up would change is refused in one sentence, never dropped."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from models import CNN, RBM, RBMSymm
from runner.config import monte_carlo
from runner.config.build import build, instantiate
from runner.core.full_sum import FullSumSampler
from runner.core.sampler import MetropolisSampler
from runner.errors import ConfigError
from runner.physics import pauli
from tests.helpers.cli import run_cli
from tests.helpers.config import compose_config

REPO = Path(__file__).resolve().parents[2]


def resolved(overrides):
    config = compose_config(overrides)
    return monte_carlo.resolve(config, instantiate, overrides)


def test_merge_replaces_a_node_of_another_target_whole_and_merges_the_rest():
    base = {"model": {"_target_": "a", "alpha": 2}, "optimizer": {"_target_": "sgd", "learning_rate": 0.1},
            "hamiltonian": {"_target_": "h", "J": 1.0, "phase_prior": "auto"}, "n_iter": 600}
    new = {"model": {"_target_": "b", "channels": 8}, "optimizer": {"_target_": "sgd", "learning_rate": {"x": 1}},
           "hamiltonian": {"phase_prior": "spiral", "J": 1.0}, "n_iter": 1400}
    merged = monte_carlo.merge(base, new)
    assert merged["model"] == {"_target_": "b", "channels": 8}
    assert merged["hamiltonian"] == {"_target_": "h", "J": 1.0, "phase_prior": "spiral"}
    assert merged["optimizer"] == {"_target_": "sgd", "learning_rate": {"x": 1}} and merged["n_iter"] == 1400
    # J is set to the value it has: not a change
    assert monte_carlo.replaced(base, new) == ["model", "optimizer.learning_rate", "hamiltonian.phase_prior", "n_iter"]


@pytest.mark.parametrize("experiment,small,large,own", [
    ("triangular_heisenberg", [], ["hilbert.L=6"], RBMSymm),
    ("triangular_heisenberg", ["hilbert.L=null", "hilbert.Lx=3", "hilbert.Ly=4"], ["hilbert.L=null", "hilbert.Lx=5",
                                                                                   "hilbert.Ly=6"], RBMSymm),
    ("kagome_heisenberg", [], ["hilbert.Lx=4", "hilbert.Ly=4"], RBM),
    ("j1j2_square", [], ["hilbert.L=6"], RBMSymm),
])
def test_a_recipe_runs_its_own_set_up_where_the_sum_fits_and_the_cnn_beyond(experiment, small, large, own):
    """At most 2^16 states: the recipe as it is (the full sum over orbits where it sums). Beyond: the CNN set-up,
    with the spiral prior, whose rotated H keeps every translation (what the translation-invariant CNN needs);
    `~monte_carlo` keeps the recipe's own set-up, by Monte Carlo, at any size."""
    summed = build(compose_config([f"experiment={experiment}", *small]))
    assert isinstance(summed.problem.model, own)
    if experiment != "j1j2_square":  # the J1-J2 recipe samples at every size
        assert isinstance(summed.problem.sampler, FullSumSampler)
    sampled = build(compose_config([f"experiment={experiment}", *large]))
    assert isinstance(sampled.problem.model, CNN) and sampled.dtype_name == "complex64_mixed"
    sampler = sampled.problem.sampler
    assert isinstance(sampler, MetropolisSampler) and (sampler.n_samples, sampler.n_chains) == (512, 64)
    ham = sampled.hamiltonian
    assert ham.rotated and pauli.not_invariant_under(ham, sampled.hilbert.space_group.rows("translations")) is None
    own_beyond = build(compose_config([f"experiment={experiment}", *large, "~monte_carlo"]))
    assert isinstance(own_beyond.problem.model, own) and isinstance(own_beyond.problem.sampler, MetropolisSampler)


def test_the_set_up_keeps_the_recipes_other_keys():
    """J2 and the lattice come from the recipe (and the command line); only the keys the set-up names change."""
    config = resolved(["experiment=j1j2_square", "hilbert.L=6", "hamiltonian.J2=0.4"])
    assert config["hamiltonian"]["J2"] == 0.4 and config["hamiltonian"]["phase_prior"] == "spiral"
    assert config["hilbert"]["L"] == 6 and "monte_carlo" not in config
    small = resolved(["experiment=j1j2_square"])
    assert small == {k: v for k, v in compose_config(["experiment=j1j2_square"]).items() if k != "monte_carlo"}


@pytest.mark.parametrize("override,key", [("n_iter=3", "monte_carlo.n_iter"), ("model.alpha=3", "monte_carlo.model"),
                                          ("sampler.n_samples=4096", "monte_carlo.sampler.n_samples"),
                                          ("hamiltonian.phase_prior=none", "monte_carlo.hamiltonian.phase_prior")])
def test_a_command_line_key_the_set_up_changes_is_refused_and_its_monte_carlo_key_works(override, key):
    with pytest.raises(ConfigError, match=rf"^{override} is replaced by the monte_carlo set-up.*set {key}"):
        resolved(["experiment=triangular_heisenberg", "hilbert.L=6", override])
    resolved(["experiment=triangular_heisenberg", override])  # the recipe's own set-up takes it
    if override == "n_iter=3":
        assert resolved(["experiment=triangular_heisenberg", "hilbert.L=6", "monte_carlo.n_iter=3"])["n_iter"] == 3


def test_debug_fast_shrinks_the_set_up_and_changes_nothing_without_one():
    config = resolved(["experiment=triangular_heisenberg", "hilbert.L=6", "debug=fast", "n_iter=2"])
    assert (config["n_iter"], config["final_rounds"], config["sampler"]["n_samples"]) == (2, 1, 128)
    plain = compose_config(["debug=fast", "hilbert.L=40"])
    assert resolved(["debug=fast", "hilbert.L=40"]) == {k: v for k, v in plain.items() if k != "monte_carlo"}


def test_heisenberg_cnn_is_the_set_up_at_every_size():
    """`above: 0`: the CNN set-up on a torus the full sum covers (how a small torus checks the set-up)."""
    small = build(compose_config(["experiment=heisenberg_cnn", "hilbert.L=null", "hilbert.Lx=3", "hilbert.Ly=4"]))
    assert isinstance(small.problem.model, CNN) and isinstance(small.problem.sampler, MetropolisSampler)
    assert small.sector is None and small.hilbert.n_states <= 2**16 and small.hamiltonian.rotated


@pytest.mark.parametrize("block,key", [({"hilbert": {"L": 4}}, "monte_carlo.hilbert"), ({"above": -1}, "monte_carlo.above"),
                                       ("cnn", "monte_carlo")])
def test_a_bad_set_up_is_refused(block, key):
    with pytest.raises(ConfigError, match=rf"^{key} "):
        monte_carlo.resolve({"monte_carlo": block, "n_iter": 1}, lambda group, node: SimpleNamespace(n_states=10))


def test_the_cli_refuses_a_replaced_key_in_one_sentence(tmp_path):
    proc = run_cli(["experiment=triangular_heisenberg", "hilbert.L=6", "n_iter=3",
                    f"hydra.run.dir={tmp_path / 'run'}"], REPO)
    assert proc.returncode == 2 and "n_iter=3 is replaced by the monte_carlo set-up" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "run").exists()
