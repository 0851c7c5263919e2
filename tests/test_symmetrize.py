"""Symmetry projection: the stable log-sum equals the explicit sum of amplitudes over the images."""

import jax.numpy as jnp
import numpy as np
import pytest

from models import symmetrize
from runner import hilbert as hb


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
