"""Sector projection: the stable log-sum equals the explicit sum of amplitudes over the images, the
projected models transform as their sector says, and equal the dense projector of
`runner.physics.symmetry` applied to the unprojected model."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import CNN, RBM, RBMSymm, ViT, symmetrize
from runner.errors import ConfigError
from runner.physics import hilbert as hb
from runner.physics import symmetry
from runner.physics.symmetry import Sector


def _random_log_psi(n_sites, complex_out, scale):
    """A fixed non-symmetric log psi [..., N] -> [...] (a random quadratic form)."""
    rng = np.random.default_rng(0)
    a = rng.normal(size=(n_sites, n_sites)) * scale / n_sites
    b = rng.normal(size=n_sites) * scale / n_sites
    if complex_out:
        a = a + 1j * rng.normal(size=(n_sites, n_sites)) / n_sites
    a, b = jnp.asarray(a), jnp.asarray(b)
    return lambda s: jnp.einsum("...i,ij,...j->...", s, a, s) + s @ b


def _amplitudes(log_psi):
    """psi / max |psi| from log psi (no overflow)."""
    log_psi = np.asarray(log_psi, complex)
    return np.exp(log_psi - np.max(log_psi.real))


def _proportional(got, expected, rtol=1e-9):
    """got = c expected for one complex c (the projections differ in normalisation only)."""
    got, expected = np.asarray(got), np.asarray(expected)
    c = np.vdot(expected, got) / np.vdot(expected, expected)
    assert abs(c) > 0
    np.testing.assert_allclose(got, c * expected, rtol=0, atol=rtol * np.max(np.abs(got)))


@pytest.mark.parametrize("sector", [Sector((1, 1), "A'", None), Sector((0, 0), "A1", 1), Sector((1, 0), "A'", -1),
                                    Sector((0, 0), "B1", -1)])
def test_projection_equals_the_explicit_sum_over_the_little_group(sector):
    """psi_P(s) = sum_{g in G_k} chi(g)* psi(g s) (and the flip), on the 3 x 2 torus."""
    hilbert = hb.square(Lx=3, Ly=2)
    group = symmetry.space_group(hilbert)
    projection = symmetrize.projection_of(sector, hilbert)
    log_psi = _random_log_psi(6, True, scale=3.0)
    states = jnp.asarray(hb.all_states(hilbert), jnp.float64)
    got = np.exp(np.asarray(symmetrize.project(log_psi, states, projection)))
    elements, chi = symmetry.characters(group, sector)
    expected = np.zeros(len(states), complex)
    for e, c in zip(elements, chi):
        perm = group.perm_ExN[e]
        expected += np.conj(c) * np.exp(np.asarray(log_psi(states[:, perm])))
        if sector.parity is not None:
            expected += sector.parity * np.conj(c) * np.exp(np.asarray(log_psi(-states[:, perm])))
    _proportional(got, expected)


def test_projection_is_finite_for_huge_log_psi():
    hilbert = hb.chain(6)
    log_psi = _random_log_psi(6, True, scale=1e4)  # |log psi| ~ 1e4: exp overflows without the shift
    states = jnp.asarray(hb.all_states(hilbert), jnp.float64)
    projection = symmetrize.projection_of(Sector((0,), "A'", 1), hilbert)
    got = symmetrize.project(log_psi, states, projection)
    assert np.all(np.isfinite(np.asarray(got)))
    images = [log_psi(sign * states[:, p]) for p in projection.perms[:12] for sign in (1, -1)]
    largest = np.max(np.real(np.stack(images)), axis=0)
    assert np.all(np.real(np.asarray(got)) <= largest + np.log(24) + 1e-6)


def test_no_sector_is_the_model_itself():
    hilbert = hb.chain(4)
    log_psi = _random_log_psi(4, False, 1.0)
    states = jnp.asarray(hb.all_states(hilbert), jnp.float64)
    assert symmetrize.projection_of(None, hilbert) is None
    np.testing.assert_array_equal(np.asarray(symmetrize.project(log_psi, states, None)), np.asarray(log_psi(states)))


def test_translation_cosets_give_the_little_group_sum_of_a_translation_invariant_log_psi():
    """With the model's invariance under the translations the projection takes one image per coset
    (8 of 128 on the 4 x 4 torus, 16 with the flip) and gives the same state as the full sum."""
    hilbert = hb.square(4)
    base = _random_log_psi(16, True, scale=2.0)
    rows = np.asarray(hilbert.translations)
    invariant = lambda s: jax.nn.logsumexp(jnp.stack([base(s[..., t]) for t in rows]), axis=0)  # noqa: E731
    invariance = symmetrize.Invariance(symmetrize.translations_by(hilbert, 1), "the translations", "-")
    states = jnp.asarray(hb.all_states(hilbert._replace(total_sz=0.0))[::131], jnp.float64)
    sector = Sector((0, 0), "B2", -1)
    cosets, full = (symmetrize.projection_of(sector, hilbert, inv) for inv in (invariance, None))
    assert (len(cosets.perms), len(full.perms)) == (16, 256)
    psi_cosets, psi_full = (np.exp(np.asarray(symmetrize.project(invariant, states, p))) for p in (cosets, full))
    assert np.ptp(np.abs(psi_full)) > 1e-3 * np.max(np.abs(psi_full))
    _proportional(psi_cosets, psi_full)


@pytest.mark.parametrize("make_hilbert, spec", [
    (lambda: hb.kagome(None, Lx=2, Ly=3), {"momentum": [1, 0], "irrep": "A", "parity": -1}),
    (lambda: hb.kagome(2), {"momentum": [0, 0], "irrep": "B1"}),
    (lambda: hb.square(4), {"momentum": [2, 2], "irrep": "A1"}),
])
def test_the_sector_kernel_is_the_group_where_its_characters_are_one(make_hilbert, spec):
    """`kernel_of`: the little group's elements with chi = 1, closed under composition, identity
    first; rbm_symm shares its weights over it and sums one image per coset (with parity, twice)."""
    hilbert = make_hilbert()
    group = symmetry.space_group(hilbert)
    sector = symmetry.parse_sector(spec, hilbert, "sector", group)
    elements, chi = symmetry.characters(group, sector)
    kernel_HxN = symmetrize.kernel_of(sector, hilbert)
    rows = {tuple(r) for r in kernel_HxN.tolist()}
    assert rows == {tuple(group.perm_ExN[e]) for e, c in zip(elements, chi) if abs(c - 1) < 1e-9}
    np.testing.assert_array_equal(kernel_HxN[0], np.arange(hilbert.n_sites))
    assert all(tuple(a[b]) in rows for a in kernel_HxN for b in kernel_HxN)
    model = RBMSymm(alpha=1, group="sector", sector=spec, hilbert=hilbert)
    flips = 1 if sector.parity is None else 2
    assert len(model.sector.perms) == flips * len(elements) // len(kernel_HxN)
    np.testing.assert_array_equal(model.group_GxN(), kernel_HxN)


# --- the projected lattice models: how they transform, and the dense projector ---------------

KAGOME = {"momentum": [0, 0], "irrep": "B1", "parity": 1}  # the ground sector of the 2 x 2 Heisenberg kagome
PROJECTED = {
    "rbm_symm_kagome_B1": (lambda: hb.kagome(2), lambda h: RBMSymm(
        alpha=2, sector=KAGOME, param_dtype=jnp.complex128, hilbert=h)),
    "rbm_symm_lattice_odd": (lambda: hb.kagome(2), lambda h: RBMSymm(
        alpha=1, group="lattice", sector={"momentum": [0, 0], "irrep": "A1", "parity": -1}, hilbert=h)),
    "cnn_kagome_A1": (lambda: hb.kagome(2), lambda h: CNN(
        channels=2, depth=2, sector={"momentum": [0, 0], "irrep": "A1"}, param_dtype=jnp.complex128, hilbert=h)),
    "cnn_square_B1_odd": (lambda: hb.square(Lx=4, Ly=2), lambda h: CNN(
        channels=2, depth=1, sector={"momentum": [0, 0], "irrep": "B1", "parity": -1}, hilbert=h)),
    "vit_kagome_k": (lambda: hb.kagome(2), lambda h: ViT(
        patch_size=2, d_model=4, n_heads=1, sector={"momentum": [1, 0], "irrep": "B2", "parity": -1}, hilbert=h)),
    "rbm_kagome_k": (lambda: hb.kagome(None, Lx=2, Ly=3), lambda h: RBM(
        alpha=1, sector={"momentum": [1, 0], "irrep": "A", "parity": -1}, param_dtype=jnp.complex128, hilbert=h)),
    "rbm_symm_sector_kernel_k": (lambda: hb.kagome(None, Lx=2, Ly=3), lambda h: RBMSymm(
        alpha=2, group="sector", sector={"momentum": [1, 0], "irrep": "A", "parity": -1}, param_dtype=jnp.complex128,
        hilbert=h)),
    "vit_chain_k": (lambda: hb.chain(8), lambda h: ViT(
        patch_size=4, d_model=4, n_heads=2, sector={"momentum": [2], "irrep": "A"}, param_dtype=jnp.complex128,
        hilbert=h)),
}


@pytest.mark.parametrize("name", sorted(PROJECTED))
@pytest.mark.slow
def test_projected_models_transform_as_their_sector_and_are_the_dense_projection(name):
    """psi(g s) = chi(g) psi(s) for every g of the little group, and psi(-s) = parity psi(s), on
    random configurations; and over a whole (Sz = 0) basis the projected amplitudes are P psi
    (`symmetry.project`) of the same parameters without a sector, up to normalisation."""
    make_hilbert, make_model = PROJECTED[name]
    hilbert = make_hilbert()
    model = make_model(hilbert)
    sector = model.sector.sector
    basis = hilbert._replace(total_sz=0.0) if hilbert.n_sites > 8 else hilbert
    states_DxN = hb.all_states(basis)
    params = model.init(jax.random.PRNGKey(0), jnp.asarray(states_DxN[:1]))["params"]
    params = jax.tree_util.tree_map(lambda x: 4 * x, params)
    group = symmetry.space_group(hilbert)
    elements, chi_G = symmetry.characters(group, sector)
    spins_SxN = np.where(np.random.default_rng(1).random((6, hilbert.n_sites)) < 0.5, 1, -1).astype(np.int8)
    moved_SxGxN = spins_SxN[:, group.perm_ExN[elements]]
    batch = np.concatenate([states_DxN, moved_SxGxN.reshape(-1, hilbert.n_sites), -spins_SxN])
    log_psi = np.asarray(jax.jit(lambda s: model.apply({"params": params}, s))(jnp.asarray(batch)), complex)
    shift = np.max(log_psi.real)
    projected_D = np.exp(log_psi[:len(states_DxN)] - shift)
    psi_SxG = np.exp(log_psi[len(states_DxN):-len(spins_SxN)] - shift).reshape(len(spins_SxN), -1)
    flipped_S = np.exp(log_psi[-len(spins_SxN):] - shift)
    scale = np.max(np.abs(psi_SxG))
    assert np.ptp(np.abs(psi_SxG[:, 0])) > 1e-3 * scale  # not a constant
    np.testing.assert_allclose(psi_SxG, chi_G[None, :] * psi_SxG[:, :1], rtol=1e-8, atol=1e-10 * scale)
    if sector.parity is not None:
        np.testing.assert_allclose(flipped_S, sector.parity * psi_SxG[:, 0], rtol=1e-8, atol=1e-10 * scale)
    unprojected = jax.jit(lambda s: model.apply({"params": params}, s, method="unprojected"))
    psi_D = _amplitudes(unprojected(jnp.asarray(states_DxN)))
    _proportional(projected_D, symmetry.project(basis, sector, psi_D))


def test_a_sector_that_leaves_the_model_alone_keeps_its_fast_paths():
    """rbm_symm over the space group at k = 0 A1 without parity is the model itself (the identity
    alone): log psi bit for bit, and its fast paths."""
    from models.fast_paths import resolve

    hilbert = hb.kagome(2)
    plain = RBMSymm(alpha=1, group="lattice", hilbert=hilbert)
    same = RBMSymm(alpha=1, group="lattice", sector={"momentum": [0, 0], "irrep": "A1"}, hilbert=hilbert)
    assert same.sector.trivial and resolve(same) is not None
    states = jnp.asarray(hb.all_states(hilbert)[::37])
    params = plain.init(jax.random.PRNGKey(0), states[:1])
    np.testing.assert_array_equal(np.asarray(same.apply(params, states)), np.asarray(plain.apply(params, states)))
    projected = resolve(RBMSymm(alpha=1, sector=KAGOME, hilbert=hilbert))  # its ratios only: of the projection
    assert projected.ratio is not None and projected.amplitude is None


# --- refusals ------------------------------------------------------------------------------------

@pytest.mark.parametrize("make, key, words", [
    (lambda: CNN(sector={"momentum": [1, 0], "irrep": "A'"}, hilbert=hb.square(4)), "sector",
     "invariant under the translations"),
    (lambda: RBMSymm(sector={"momentum": [0, 1], "irrep": "A'"}, hilbert=hb.square(4)), "sector", "model=vit"),
    (lambda: RBMSymm(group="lattice", sector={"momentum": [0, 0], "irrep": "B1"}, hilbert=hb.square(4)), "sector",
     "group=translations"),
    (lambda: ViT(patch_size=2, sector={"momentum": [1, 0], "irrep": "A'"}, hilbert=hb.square(4)), "sector",
     "whole patches"),
    (lambda: CNN(sector={"momentum": [0, 0], "irrep": "A2"}, hilbert=hb.square(Lx=2, Ly=4)), "sector",
     "holds no state"),
    (lambda: CNN(sector={"momentum": [0, 0], "irrep": "E"}, hilbert=hb.square(4)), "sector.irrep", "A1, A2, B1, B2"),
    (lambda: CNN(sector={"momentum": [4, 0], "irrep": "A1"}, hilbert=hb.square(4)), "sector.momentum", "0..3"),
    (lambda: CNN(sector={"momentum": [0, 0], "irrep": "A1", "parity": 1}, hilbert=hb.square(4, total_sz=1)),
     "sector.parity", "total_sz"),
    (lambda: CNN(sector=Sector((0, 0), "A1", -1), hilbert=hb.square(4, total_sz=1)), "sector", "total_sz"),
    (lambda: CNN(sector="B1", hilbert=hb.square(4)), "sector", "null, auto or"),
    (lambda: RBMSymm(group="sector", hilbert=hb.square(4)), "group", "needs model.sector"),
    (lambda: CNN(sector="auto", hilbert=hb.square(4)), "sector", "resolved by the runner"),
])
def test_bad_sectors_are_one_sentence(make, key, words):
    with pytest.raises(ConfigError) as info:
        make()
    assert info.value.key == key and words in info.value.message, info.value
