"""Every option of every config group composes and builds; bad values name their key."""

import pytest

from runner.config.build import GROUPS, build
from runner.errors import ConfigError
from tests.helpers.config import CONF, KAGOME, compose_config

# Options that need a compatible choice elsewhere to make a valid experiment.
COMPANIONS = {
    "hilbert": {"square": ["hilbert.L=3"]},
    "hamiltonian": {"heisenberg": ["hilbert.total_sz=0", "sampler=metropolis_exchange"]},
    "sampler": {"metropolis_exchange": ["hilbert.total_sz=0", "hamiltonian=heisenberg"]},
}


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
    elif option.startswith("full_sum_"):  # one configuration per orbit (the space fits: full_sum_or_exchange sums)
        assert experiment.problem.sampler.symmetry == config["sampler"]["symmetry"] != "none"
        assert experiment.problem.sampler.n_configurations < experiment.hilbert.n_states
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


# --- model.sector: parsed and `auto` resolved before the model is built -----------------------

def test_auto_is_the_exact_ground_sector_where_the_exact_solver_runs():
    """The 2 x 2 kagome Heisenberg ground state lies in k=(0,0) B1 P=+1 (docs/physics.md); the
    fingerprint keeps `auto` as written."""
    from runner.physics.symmetry import Sector

    experiment = build(compose_config([*KAGOME, "model.sector=auto", "exact=auto"]))
    assert experiment.sector == Sector((0, 0), "B1", 1, 0.0)
    assert experiment.problem.model.sector.sector == experiment.sector
    assert experiment.settings.fingerprint["model.sector"] == "auto"


def test_auto_finds_the_sector_by_the_spectrum_by_sector_beyond_the_lanczos_limit(monkeypatch):
    """`exact: auto` runs the spectrum by sector up to SECTOR_AUTO_MAX_STATES states, past the whole
    space's Lanczos limit (AUTO_MAX_STATES); beyond both, the trivial sector."""
    from runner.physics import exact
    from runner.physics.symmetry import Sector

    monkeypatch.setattr(exact, "AUTO_MAX_STATES", 100)  # kagome 2 x 2 at Sz = 0: 924 states
    config = compose_config([*KAGOME, "model.sector=auto", "exact=auto"])
    assert build(config).sector == Sector((0, 0), "B1", 1, 0.0)
    monkeypatch.setattr(exact, "SECTOR_AUTO_MAX_STATES", 100)
    assert build(config).sector == Sector((0, 0), "A1", None, 0.0)


def test_auto_is_the_trivial_sector_without_the_exact_solver():
    from runner.physics.symmetry import Sector

    experiment = build(compose_config([*KAGOME, "model.sector=auto", "exact=false"]))
    assert experiment.sector == Sector((0, 0), "A1", None, 0.0)
    chain = build(compose_config(["model=rbm_symm", "model.sector=auto", "exact=false"]))
    assert chain.sector == Sector((0,), "A'", None, None)


def test_auto_falls_back_to_the_trivial_sector_with_a_warning_when_a_2d_irrep_holds_the_ground_state(
        monkeypatch, caplog):
    from runner.config import build as build_module
    from runner.physics.symmetry import Sector

    monkeypatch.setattr(build_module.spectrum, "ground_sector", lambda hamiltonian, hilbert: (None, -1.0))
    with caplog.at_level("WARNING"):
        experiment = build(compose_config([*KAGOME, "model.sector=auto", "exact=true"]))
    assert experiment.sector == Sector((0, 0), "A1", None, 0.0)
    lines = [r.getMessage() for r in caplog.records if "two-dimensional irrep" in r.getMessage()]
    assert len(lines) == 1 and "k=(0,0) A1" in lines[0]


def test_a_given_sector_and_null():
    from runner.physics.symmetry import Sector

    experiment = build(compose_config([*KAGOME, "model.sector={momentum:[0,0],irrep:B2,parity:-1}"]))
    assert experiment.sector == Sector((0, 0), "B2", -1, 0.0)
    assert experiment.settings.fingerprint["model.sector.irrep"] == "B2"
    plain = build(compose_config(KAGOME))
    assert plain.sector is None and plain.problem.model.sector is None


@pytest.mark.parametrize("overrides, key, words", [
    (["model.sector={momentum:[1,0],irrep:A1}"], "model.sector", "model=vit"),
    (["model.sector={momentum:[0,0],irrep:E}"], "model.sector.irrep", "A1, A2, B1, B2"),
    (["model.sector={momentum:[0,0,0],irrep:A1}"], "model.sector.momentum", "2 integers"),
    (["model.sector={momentum:[0,0],irrep:A1,parity:1}", "hilbert.total_sz=1"], "model.sector.parity", "total_sz"),
    (["model.sector=B1"], "model.sector", "null, auto or"),
    (["model.sector=auto", "hamiltonian=pauli", "hamiltonian.terms=[{coeff:1.0,ops:Z,on:[[0]]}]",
      "sampler=metropolis_local", "hilbert.total_sz=null"], "model.sector", "auto needs"),
])
def test_bad_sectors_are_one_sentence_before_anything_compiles(overrides, key, words):
    with pytest.raises(ConfigError) as info:
        build(compose_config([*KAGOME, *overrides]))
    sentence = info.value.sentence()
    assert sentence.startswith(key + " ") and words in sentence, sentence
