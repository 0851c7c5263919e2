"""Transfers (runner.lifecycle.transfer, init_from across sizes and symmetries): a tiled
configuration keeps the small torus' features, a more symmetric model keeps what the derivation
says, a transfer the weights cannot make is refused in one sentence, and a full-sum run on a
small torus starts a Monte Carlo run on a larger one."""

import functools
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import models
from runner.config.build import build
from runner.errors import ConfigError
from runner.lifecycle import transfer, warm_start
from runner.physics import hilbert as spaces
from tests.helpers.cli import REPO, run_cli
from tests.helpers.config import compose_config


def tiled(sigma_N, small, large):
    """The configuration of `large` that repeats `sigma_N` of `small` (extents dividing)."""
    n_basis = small.n_sites // int(np.prod(small.shape))
    cells = np.stack(np.unravel_index(np.arange(large.n_sites) // n_basis, large.shape), axis=-1)
    source = np.ravel_multi_index(tuple((cells % np.asarray(small.shape)).T), small.shape) * n_basis
    return sigma_N[source + np.arange(large.n_sites) % n_basis]


def random_params(model, hilbert, seed=0):
    """Parameters with O(1) random entries (an initialisation's are near zero)."""
    params = model.init(jax.random.PRNGKey(seed), jnp.ones(hilbert.n_sites))["params"]
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map(lambda x: np.asarray(x) + 0.3 * rng.normal(size=x.shape), params)


def log_psi(model, params, sigma_xN):
    return np.asarray(model.apply({"params": params}, jnp.asarray(sigma_xN, jnp.int8)))


CNN = functools.partial(models.CNN, channels=3, depth=2)
CNN_J = functools.partial(models.CNN, channels=3, depth=2, jastrow=True)
RBM_T = functools.partial(models.RBMSymm, alpha=2)
RBM_L = functools.partial(models.RBMSymm, alpha=2, group="lattice")
GCNN = functools.partial(models.GCNN, features=(3, 3))
CHAIN = (spaces.chain(4), spaces.chain(8))
SQUARE = (spaces.square(3), spaces.square(6))
TRIANGULAR = (spaces.triangular(3), spaces.triangular(6))


@pytest.mark.parametrize("make,lattices", [
    (CNN, CHAIN), (CNN, SQUARE), (CNN_J, CHAIN), (CNN_J, SQUARE), (RBM_T, CHAIN), (RBM_L, CHAIN), (RBM_T, SQUARE),
    (GCNN, CHAIN), (GCNN, SQUARE), (GCNN, TRIANGULAR),
], ids=["cnn-chain", "cnn-square", "cnn_jastrow-chain", "cnn_jastrow-square", "rbm_symm-chain",
        "rbm_symm_lattice-chain", "rbm_symm-square", "gcnn-chain", "gcnn-square", "gcnn-triangular"])
def test_a_tiled_configuration_keeps_the_small_torus_features(make, lattices):
    """Sum pooling (CNN, its Jastrow factor, RBMSymm): log psi_large(tiled s) = (N_large / N_small)
    log psi_small(s).
    GCNN: every element's feature is the small torus' at the element it reduces to, and psi is
    a sum over the group, so log psi grows by log(T_large / T_small). Exact: every weight of a
    small-torus site or element lands on one set of images (ties split) and a tiled input sums
    them back."""
    small, large = lattices
    model_s, model_l = make(hilbert=small), make(hilbert=large)
    params_s = random_params(model_s, small)
    params_l = transfer.params(params_s, model_s, small, model_l, large)
    like = model_l.init(jax.random.PRNGKey(0), jnp.ones(large.n_sites))["params"]
    assert jax.tree_util.tree_structure(params_l) == jax.tree_util.tree_structure(like)
    sigma_xN = np.random.default_rng(1).choice([-1, 1], (4, small.n_sites))
    want = log_psi(model_s, params_s, sigma_xN)
    got = log_psi(model_l, params_l, np.stack([tiled(s, small, large) for s in sigma_xN]))
    if make is GCNN:
        copies = large.space_group.n_translations / small.space_group.n_translations
        np.testing.assert_allclose(got, want + np.log(copies), rtol=1e-12)
    else:
        np.testing.assert_allclose(got, want * large.n_sites / small.n_sites, rtol=1e-12)


def test_the_maps_put_each_weight_at_its_shortest_images():
    """chain 4 -> 8: site/translation 2 ties (+2 and -2): half at each; 3 is -1, 1 is +1."""
    small, large = CHAIN
    sites = transfer.site_map(small, large)
    expected = np.zeros((8, 4))
    expected[0, 0] = expected[1, 1] = expected[7, 3] = 1.0
    expected[2, 2] = expected[6, 2] = 0.5
    np.testing.assert_array_equal(sites, expected)
    np.testing.assert_array_equal(sites.sum(axis=0), 1.0)  # every small weight lands whole
    # ViT, 4x4 -> 8x8 with 2x2 patches: the 2x2 patch grid's displacement 1 is +-1 on the 4x4 grid
    bias = transfer.patch_map((2, 2), (4, 4), 2, spaces.square(8).space_group.vectors)
    assert bias[np.ravel_multi_index((3, 0), (4, 4)), np.ravel_multi_index((1, 0), (2, 2))] == 1.0
    assert bias[np.ravel_multi_index((1, 0), (4, 4)), np.ravel_multi_index((1, 0), (2, 2))] == 1.0
    assert bias[np.ravel_multi_index((2, 2), (4, 4))].sum() == 0  # two patches away: no source, zero


def test_a_vit_carries_everything_but_the_positional_bias_unchanged():
    small, large = spaces.square(4), spaces.square(8)
    model_s, model_l = models.ViT(hilbert=small, patch_size=2), models.ViT(hilbert=large, patch_size=2)
    params_s = random_params(model_s, small)
    params_l = transfer.params(params_s, model_s, small, model_l, large)
    for name, leaf in params_l.items():
        if name.startswith("position_bias"):
            assert leaf.shape == (2, 16)
            np.testing.assert_array_equal(leaf[:, 0], params_s[name][:, 0])
        else:
            jax.tree_util.tree_map(np.testing.assert_array_equal, leaf, params_s[name])
    assert np.all(np.isfinite(log_psi(model_l, params_l, np.ones((1, 64)))))


def test_rbm_symm_translations_to_lattice_is_the_point_group_product():
    """The filter copied: the lattice group's hidden units are the translations' on each point
    operation's image, so log psi_lat(s) = sum_p [log psi_tr(p s) - a sum s] + a sum s over the
    point operations' cosets (for a point-symmetric source, psi_tr^P up to the visible term).
    Checked on every configuration of a 6-site chain."""
    hilbert = spaces.chain(6)
    model_t, model_l = RBM_T(hilbert=hilbert), RBM_L(hilbert=hilbert)
    params = random_params(model_t, hilbert)
    sigma_xN = spaces.all_states(hilbert)
    group = hilbert.space_group
    firsts = [group.perm_ExN[group.lattice_order][np.flatnonzero(group.op_E[group.lattice_order] == p)[0]]
              for p in range(len(group.ops))]
    visible = params["visible_bias"] * sigma_xN.sum(axis=-1)
    expected = sum(log_psi(model_t, params, sigma_xN[:, perm]) - visible for perm in firsts) + visible
    np.testing.assert_allclose(log_psi(model_l, params, sigma_xN), expected, rtol=1e-12)


@pytest.mark.parametrize("make", [CNN, RBM_T, GCNN], ids=["cnn", "rbm_symm", "gcnn"])
def test_a_sector_added_projects_the_source_state(make):
    """No sector -> a sector: the parameters as they are; the new state is the source state
    projected (its unprojected log psi is the source's)."""
    hilbert = spaces.chain(6)
    sector = {"momentum": [0], "irrep": "A'", "parity": 1}
    model_s, model_p = make(hilbert=hilbert), make(hilbert=hilbert, sector=sector)
    params = random_params(model_s, hilbert)
    assert transfer.params(params, model_s, hilbert, model_p, hilbert) is params
    sigma_xN = spaces.all_states(hilbert)
    if make is GCNN:  # the sector's projection is its readout: psi_p(s) = psi(s) + psi(-s) (sum over G)
        np.testing.assert_allclose(np.exp(log_psi(model_p, params, sigma_xN)),
                                   np.exp(log_psi(model_s, params, sigma_xN)) + np.exp(log_psi(model_s, params, -sigma_xN)),
                                   rtol=1e-10)
        return
    unprojected = model_p.apply({"params": params}, jnp.asarray(sigma_xN, jnp.int8), method="unprojected")
    np.testing.assert_allclose(np.asarray(unprojected), log_psi(model_s, params, sigma_xN), rtol=1e-12)


# --- through the config: what may differ, refusals, and a whole transfer ----------------------

SOURCE = ["hilbert=square", "hilbert.L=2", "hamiltonian=heisenberg", "hilbert.total_sz=0", "model=cnn",
          "model.channels=2", "sampler=full_sum", "n_iter=3", "final_rounds=1", "peak_search=0", "checkpoint_every=1000",
          "observables=none"]
TARGET = ["hilbert=square", "hilbert.L=4", "hamiltonian=heisenberg", "hilbert.total_sz=0", "model=cnn",
          "model.channels=2", "sampler=metropolis_exchange", "sampler.n_samples=64", "sampler.n_chains=8", "n_iter=2",
          "final_rounds=1", "peak_search=0", "checkpoint_every=1000", "observables=none"]


def built(overrides):
    config = compose_config(overrides)
    return warm_start.resolve(build(config), config)


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    """A 2x2 Heisenberg CNN trained by the full sum for 3 steps."""
    run_dir = tmp_path_factory.mktemp("transfer") / "small"
    run_cli([*SOURCE, f"hydra.run.dir={run_dir}"], REPO, check=True)
    return run_dir


def test_a_full_sum_run_on_a_small_torus_starts_a_monte_carlo_run_on_a_larger_one(small_run, tmp_path):
    run_dir = tmp_path / "large"
    run_cli([*TARGET, f"init_from={small_run}", f"hydra.run.dir={run_dir}"], REPO, check=True)
    summary = json.loads((run_dir / "summary.json").read_text())
    stamp = summary["config_fingerprint"]["config"]
    source = json.loads((Path(small_run) / "summary.json").read_text())
    assert stamp["init_from.fingerprint"] == source["config_fingerprint"]["hash"] and stamp["init_from.step"] == 3
    assert stamp["hilbert.L"] == 4
    first = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert np.isfinite(first["energy"])
    assert built([*TARGET, f"init_from={small_run}"]).settings.init_from.transfer


def flat(overrides):
    from runner.config import fingerprint
    return fingerprint.of(compose_config(overrides))


@pytest.mark.parametrize("source,change,expected", [
    ("model=rbm", "hilbert.L=4", "model RBM has hidden units tied to the N sites"),
    ("model=jastrow", "hilbert.L=4", "model Jastrow has a weight per pair of sites"),
    ("model=mlp", "hilbert.L=4", "model MLP has weights per site"),
    ("model=cnn", "hilbert.L=1", "smaller than (2, 2)"),
    ("model=cnn", "hamiltonian.J2=0.5", "hamiltonian.J2 is 0.5 in this config but 0.0"),
    ("model=cnn", "hilbert.total_sz=1", "hilbert.total_sz is 1"),
    ("model=cnn", "hilbert.pbc=false", "needs a torus"),
    ("model=rbm_symm", "model.group=translations", "from a less to a more symmetric model"),
    ("model=cnn", "model.sector=null", "from a less to a more symmetric model"),
])
def test_a_transfer_the_weights_cannot_make_is_refused(source, change, expected):
    """`change` applied to a 2x2 source of `source` (the sizes change with it, but the one key
    named): one sentence naming what differs and what would carry."""
    start = ["hilbert=square", "hilbert.L=2", "hamiltonian=heisenberg", "hilbert.total_sz=0", source]
    if change.startswith("model.group"):
        start.append("model.group=lattice")
    if change.startswith("model.sector"):
        start.append("model.sector={momentum: [0, 0], irrep: A1, parity: 1}")
    target = [o for o in start if not o.startswith("hilbert.L")] + ["hilbert.L=4", change]
    if change.startswith("hilbert.L"):
        target = [o for o in start if not o.startswith("hilbert.L")] + [change]
    with pytest.raises(ConfigError) as err:
        transfer.check(flat(start), flat(target), "the run", chains=False)
    assert expected in err.value.sentence(), err.value.sentence()


def test_chains_do_not_cross_sizes_and_a_difference_outside_a_transfer_is_refused(small_run):
    with pytest.raises(ConfigError, match="init_chains is true, and the run init_from="):
        built([*TARGET, f"init_from={small_run}", "init_chains=true"])
    with pytest.raises(ConfigError, match="model.kernel_size is 2 in this config but 3"):
        built([*TARGET, f"init_from={small_run}", "model.kernel_size=2"])
    assert built([*TARGET, f"init_from={small_run}", "model.sector=auto"]).settings.init_from.transfer


def test_a_refused_transfer_on_the_command_line_is_one_sentence_and_exit_2(small_run, tmp_path):
    proc = run_cli([*[o for o in TARGET if not o.startswith("model")], "model=rbm", f"init_from={small_run}",
                    f"hydra.run.dir={tmp_path / 'run'}"], REPO)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("Config error: hilbert.L is 4 in this config but 2") and "model RBM" in lines[0]
    assert not (tmp_path / "run").exists()
