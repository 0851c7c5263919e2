"""Symmetry projection: the stable log-sum equals the explicit sum of amplitudes over the images."""

import jax.numpy as jnp
import numpy as np
import pytest

from models import symmetrize
from runner.physics import hilbert as hb


def _random_log_psi(n_sites, complex_out, scale):
    """A fixed non-symmetric log psi [..., N] -> [...] (a random quadratic form)."""
    rng = np.random.default_rng(0)
    a = rng.normal(size=(n_sites, n_sites)) * scale / n_sites
    b = rng.normal(size=n_sites) * scale / n_sites
    if complex_out:
        a = a + 1j * rng.normal(size=(n_sites, n_sites)) / n_sites
    a, b = jnp.asarray(a), jnp.asarray(b)
    return lambda s: jnp.einsum("...i,ij,...j->...", s, a, s) + s @ b


@pytest.mark.parametrize("parity", [None, 1, -1])
@pytest.mark.parametrize("complex_out", [False, True])
def test_projection_equals_the_explicit_sum(parity, complex_out):
    hilbert = hb.square(Lx=3, Ly=2)
    lattice = symmetrize.lattice_of(hilbert)
    momentum = (1, 1) if complex_out else None
    log_psi = _random_log_psi(6, complex_out, scale=3.0)
    states = jnp.asarray(hb.all_states(hilbert), jnp.float64)
    got = np.asarray(symmetrize.project(log_psi, states, lattice, "translations", parity, momentum))
    expected = np.zeros(len(states), complex)
    for t, perm in enumerate(hilbert.translations):
        dx, dy = lattice.displacement(t)
        w = np.exp(-2j * np.pi * (dx / 3 + dy / 2)) if momentum else 1.0
        expected += w * np.exp(np.asarray(log_psi(states[:, perm])))
        if parity is not None:
            expected += parity * w * np.exp(np.asarray(log_psi(-states[:, perm])))
    alive = np.abs(expected) > 1e-8 * np.max(np.abs(expected))
    np.testing.assert_allclose(np.exp(got[alive]), expected[alive], rtol=1e-10)
    assert np.iscomplexobj(got) == (complex_out or parity == -1)


def test_projection_is_finite_for_huge_log_psi():
    hilbert = hb.chain(6)
    lattice = symmetrize.lattice_of(hilbert)
    log_psi = _random_log_psi(6, True, scale=1e4)  # |log psi| ~ 1e4: exp overflows without the shift
    states = jnp.asarray(hb.all_states(hilbert), jnp.float64)
    got = symmetrize.project(log_psi, states, lattice, "translations", 1, None)
    assert np.all(np.isfinite(np.asarray(got)))
    images = [log_psi(sign * states[:, p]) for p in hilbert.translations for sign in (1, -1)]
    largest = np.max(np.real(np.stack(images)), axis=0)
    assert np.all(np.real(np.asarray(got)) <= largest + np.log(12) + 1e-6)


def test_no_symmetry_is_the_model_itself():
    hilbert = hb.chain(4)
    log_psi = _random_log_psi(4, False, 1.0)
    states = jnp.asarray(hb.all_states(hilbert), jnp.float64)
    got = symmetrize.project(log_psi, states, symmetrize.lattice_of(hilbert), "none", None, None)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(log_psi(states)))


# --- symmetries=lattice: the trivial representation of the space group ------------------------

import jax  # noqa: E402

from models import CNN, RBMSymm, ViT  # noqa: E402
from runner.errors import ConfigError  # noqa: E402


def _permuted_index(states, perm):
    """Row of s[perm] for each configuration s of the basis `states` (binary order)."""
    return np.searchsorted(hb.states_to_codes(states), hb.states_to_codes(states[:, perm]))


@pytest.mark.parametrize("parity", [None, 1, -1])
@pytest.mark.parametrize("make", [lambda: hb.chain(6), lambda: hb.triangular(3), lambda: hb.honeycomb(2),
                                  lambda: hb.kagome(2), lambda: hb.square(Lx=2, Ly=4)])
def test_lattice_projection_is_the_space_group_sum_and_invariant(make, parity):
    """psi_P = sum over the space group (and spin flips) of psi on the images, and the dense
    projected state is an eigenvector with eigenvalue 1 of every group permutation."""
    hilbert = make()
    lattice = symmetrize.lattice_of(hilbert)
    assert len(lattice.space_group) > len(lattice.translations)
    states_np = hb.all_states(hilbert)
    states = jnp.asarray(states_np, jnp.float64)
    log_psi = _random_log_psi(hilbert.n_sites, True, scale=3.0)
    got = np.asarray(symmetrize.project(log_psi, states, lattice, "lattice", parity, None))
    expected = np.zeros(len(states), complex)
    for g in hilbert.space_group:
        expected += np.exp(np.asarray(log_psi(states[:, g])))
        if parity is not None:
            expected += parity * np.exp(np.asarray(log_psi(-states[:, g])))
    psi = np.exp(got)
    scale = np.max(np.abs(expected))
    np.testing.assert_allclose(psi, expected, rtol=1e-10, atol=1e-12 * scale)
    for g in hilbert.space_group:
        np.testing.assert_allclose(psi[_permuted_index(states_np, g)], psi, rtol=1e-10, atol=1e-12 * scale)
    if parity is not None:
        return  # (on the 6-ring every mirror image is a translate of the configuration or of its flip)
    # the translations alone leave it a non-symmetric state: the invariance above comes from the point group
    psi_t = np.exp(np.asarray(symmetrize.project(log_psi, states, lattice, "translations", parity, None)))
    worst = max(np.max(np.abs(psi_t[_permuted_index(states_np, g)] - psi_t)) for g in hilbert.space_group)
    assert worst > 1e-3 * np.max(np.abs(psi_t))


def test_lattice_projection_of_the_square_4x4():
    """All 128 elements on the 4x4 torus (a sample of the Sz = 0 sector): invariance and the sum."""
    hilbert = hb.square(4)
    lattice = symmetrize.lattice_of(hilbert)
    assert lattice.space_group_GxN.shape == (128, 16)
    states = jnp.asarray(hb.all_states(hilbert._replace(total_sz=0.0))[::50], jnp.float64)
    log_psi = _random_log_psi(16, False, scale=3.0)
    project = jax.jit(lambda s: symmetrize.project(log_psi, s, lattice, "lattice", None, None))
    got = np.asarray(project(states))
    expected = sum(np.exp(np.asarray(log_psi(states[:, g]))) for g in hilbert.space_group)
    np.testing.assert_allclose(np.exp(got), expected, rtol=1e-11)
    for g in hilbert.space_group:
        np.testing.assert_allclose(np.asarray(project(states[:, g])), got, atol=1e-11)


LATTICE_PROJECTED = {
    "rbm_symm": lambda h, d: RBMSymm(alpha=1, symmetries="lattice", parity=1, param_dtype=d, hilbert=h),
    "cnn": lambda h, d: CNN(channels=2, depth=2, symmetries="lattice", param_dtype=d, hilbert=h),
    "vit": lambda h, d: ViT(patch_size=2, d_model=4, n_heads=2, symmetries="lattice", param_dtype=d, hilbert=h),
}


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.complex128])
@pytest.mark.parametrize("name", list(LATTICE_PROJECTED))
def test_models_with_symmetries_lattice_are_invariant(name, dtype):
    hilbert = hb.square(4)
    model = LATTICE_PROJECTED[name](hilbert, dtype)
    states = jnp.asarray(hb.all_states(hilbert._replace(total_sz=0.0))[::2500])
    params = model.init(jax.random.PRNGKey(0), states[0])["params"]
    params = jax.tree_util.tree_map(lambda x: 5 * x, params)  # away from the near-uniform start
    moved_SxGxN = states[:, hilbert.space_group]  # every configuration under every element
    log_psi_SxG = np.asarray(jax.jit(lambda s: model.apply({"params": params}, s))(moved_SxGxN))
    log_psi_S = log_psi_SxG[:, :1]
    assert np.ptp(log_psi_S.real) > 1e-2  # not a constant
    np.testing.assert_allclose(log_psi_SxG.real, np.broadcast_to(log_psi_S.real, log_psi_SxG.shape), atol=1e-10)
    np.testing.assert_allclose(np.exp(1j * (log_psi_SxG.imag - log_psi_S.imag)), 1.0, atol=1e-9)


def test_lattice_keys():
    lattice = symmetrize.lattice_of(hb.square(4))
    assert symmetrize.check_keys("lattice", 1, None, lattice) is None
    with pytest.raises(ConfigError) as info:
        symmetrize.check_keys("lattice", None, [1, 0], lattice)
    assert info.value.key == "momentum"
    with pytest.raises(ConfigError) as info:
        symmetrize.check_keys("point_group", None, None, lattice)
    assert info.value.key == "symmetries" and "lattice" in str(info.value)
    perm_GxN, sign_G, weight_G = symmetrize.images(lattice, "lattice", -1, None)
    assert perm_GxN.shape == (256, 16)
    np.testing.assert_array_equal(perm_GxN[:128], lattice.space_group_GxN)
    np.testing.assert_array_equal(sign_G, [1] * 128 + [-1] * 128)
    np.testing.assert_array_equal(weight_G, [1] * 128 + [-1] * 128)
    graph = symmetrize.lattice_of(hb.graph(3, [[0, 1], [1, 2]]))
    np.testing.assert_array_equal(graph.space_group_GxN, [[0, 1, 2]])


# --- symmetries=point: the space group at 1/T the cost, for translation-invariant models -------

@pytest.mark.parametrize("make, n_point", [(lambda: hb.chain(6), 2), (lambda: hb.square(4), 8),
                                           (lambda: hb.square(Lx=2, Ly=4), 2), (lambda: hb.triangular(3), 12),
                                           (lambda: hb.honeycomb(2), 12)])
def test_point_rows_are_one_per_coset_of_the_translations(make, n_point):
    """(On the 2 x 4 torus the mirror x -> -x is the identity on two columns: 2 cosets, not 4.)"""
    lattice = symmetrize.lattice_of(make())
    point_PxN, group_GxN = lattice.point_group_PxN, lattice.space_group_GxN
    assert point_PxN.shape == (n_point, lattice.n_sites) and len(group_GxN) == n_point * len(lattice.translations)
    np.testing.assert_array_equal(point_PxN[0], np.arange(lattice.n_sites))
    # every space-group element is exactly one translation after exactly one of the rows
    products = {tuple(t[p].tolist()) for p in point_PxN for t in lattice.translations_TxN}
    assert products == {tuple(g.tolist()) for g in group_GxN}


@pytest.mark.parametrize("parity", [None, 1])
@pytest.mark.parametrize("make", [
    lambda h, s, p: RBMSymm(alpha=2, group="translations", symmetries=s, parity=p, param_dtype=jnp.complex128, hilbert=h),
    lambda h, s, p: CNN(channels=2, depth=2, symmetries=s, parity=p, param_dtype=jnp.float64, hilbert=h)])
def test_point_projection_of_a_translation_invariant_model_is_the_lattice_one(make, parity):
    """log psi_point = log psi_lattice - log T on the 4x4 torus, for every configuration."""
    hilbert = hb.square(4)
    states = jnp.asarray(hb.all_states(hilbert._replace(total_sz=0.0))[::97])
    point, full = make(hilbert, "point", parity), make(hilbert, "lattice", parity)
    params = point.init(jax.random.PRNGKey(1), states[0])["params"]
    params = jax.tree_util.tree_map(lambda x: 5 * x, params)
    got = np.asarray(point.apply({"params": params}, states))
    expected = np.asarray(full.apply({"params": params}, states)) - np.log(16)
    assert np.ptp(got.real) > 1e-2
    np.testing.assert_allclose(got.real, expected.real, atol=1e-10)
    np.testing.assert_allclose(np.exp(1j * (got.imag - expected.imag)), 1.0, atol=1e-9)


def test_point_projection_is_refused_where_the_model_is_not_translation_invariant():
    with pytest.raises(ConfigError) as info:
        ViT(patch_size=2, d_model=4, n_heads=2, symmetries="point", hilbert=hb.square(4))
    assert info.value.key == "symmetries" and "translations" in str(info.value)
    with pytest.raises(ConfigError):
        CNN(channels=2, symmetries="point", hilbert=hb.square(4, pbc=False))
