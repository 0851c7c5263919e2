"""The `spiral` phase prior: theta_i = q . R_i + phi_b at the commensurate order of lowest classical energy, against
dense U H U^dagger and exact spectra; it is Marshall on even square tori and honeycomb, the 120-degree pattern on
triangular tori with sides multiples of 3 and the q = 0 order on kagome, keeps the translations everywhere, and
moves ground states away from k = 0 to it."""

import math

import numpy as np
import pytest

from runner.errors import ConfigError
from runner.physics import exact, hamiltonians, pauli, spectrum
from runner.physics import hilbert as hb
from tests.helpers.dense import dense_heisenberg, dense_phase, on_states


def _angles(ham, n):
    theta = np.zeros(n)
    theta[list(ham.rotated or ())] = ham.angles or ()
    return theta


@pytest.mark.parametrize("make,J2", [(lambda: hb.triangular(Lx=4, Ly=2), 0.0),
                                     (lambda: hb.triangular(Lx=3, Ly=3, pbc=False), 0.2)])
def test_spiral_is_the_unitary_claimed(make, J2):
    """H' = U H U^dagger on the whole space (8 and 9 sites, J2 included on the open lattice)."""
    lattice = make()
    n = lattice.n_sites
    ham = hamiltonians.heisenberg(lattice, J2=J2, phase_prior="spiral")
    assert ham.rotated  # not the identity
    U = dense_phase(ham, n)
    H = dense_heisenberg(lattice.bonds, lattice.next_bonds, n, 1.0, J2)
    got, idx = on_states(ham, lattice)
    np.testing.assert_allclose(got, (U @ H @ U.conj().T)[np.ix_(idx, idx)], atol=1e-12)


@pytest.mark.parametrize("make", [lambda: hb.triangular(4, total_sz=0), lambda: hb.triangular(Lx=3, Ly=4, total_sz=0),
                                  lambda: hb.square(Lx=3, Ly=4, total_sz=0), lambda: hb.chain(10, total_sz=0)])
def test_spectrum_unchanged_and_translations_kept(make):
    lattice = make()
    plain, rotated = (hamiltonians.heisenberg(lattice, phase_prior=p) for p in ("none", "spiral"))
    assert pauli.not_invariant_under(rotated, lattice.space_group.rows("translations")) is None
    levels = [exact.lowest_levels(exact.operator(h, lattice), 3) for h in (plain, rotated)]
    np.testing.assert_allclose(levels[1], levels[0], atol=1e-9)


def test_spiral_is_marshall_on_an_even_square_torus_and_the_120_degree_pattern_on_a_triangular_one():
    """The square 4 x 4 (J2 = 0 and 0.5): q = (pi, pi), the Marshall rotation's H; the triangular 3 x 6: every bond
    turns by +-2 pi / 3 as under three_sublattice, with the same spectrum; the chain: q = pi."""
    square = hb.square(4, total_sz=0)
    for J2 in (0.0, 0.5):  # at J2 = 0.5 stripes tie classically; the nearest-neighbour bonds pick the Neel order
        spiral, marshall = (hamiltonians.heisenberg(square, J2=J2, phase_prior=p) for p in ("spiral", "marshall"))
        assert spiral.is_real and sorted(spiral.terms) == sorted(marshall.terms)
    chain = hb.chain(6)
    assert sorted(hamiltonians.heisenberg(chain, phase_prior="spiral").terms) == sorted(
        hamiltonians.heisenberg(chain, phase_prior="marshall").terms)
    lattice = hb.triangular(Lx=3, Ly=6, total_sz=0)
    ham = hamiltonians.heisenberg(lattice, phase_prior="spiral")
    theta = _angles(ham, lattice.n_sites)
    turns = np.mod(theta[lattice.bonds[:, 0]] - theta[lattice.bonds[:, 1]], 2 * math.pi)
    np.testing.assert_allclose(np.minimum(turns, 2 * math.pi - turns), 2 * math.pi / 3, atol=1e-12)
    other = hamiltonians.heisenberg(lattice, phase_prior="three_sublattice")
    np.testing.assert_allclose(spectrum.lowest_levels_in(ham, lattice, 2), spectrum.lowest_levels_in(other, lattice, 2),
                               atol=1e-8)


def test_spiral_moves_the_3x4_ground_state_to_zero_momentum():
    """The triangular 3 x 4 torus's ground level (k = (0, 2)) has no translation-invariant state without a
    prior (three_sublattice does not fit it); under spiral the lowest translation-invariant level is the ground
    level, so a translation-invariant model can reach it."""
    lattice = hb.triangular(Lx=3, Ly=4, total_sz=0)
    translations = lattice.space_group.rows("translations")
    plain, rotated = (hamiltonians.heisenberg(lattice, phase_prior=p) for p in ("none", "spiral"))
    ground = spectrum.lowest_levels_in(plain, lattice, 1)[0]
    np.testing.assert_allclose(ground, -27.7232494515, atol=1e-9)
    assert spectrum.invariant_levels(plain, lattice, 1, translations)[0] > ground + 1.0
    np.testing.assert_allclose(spectrum.invariant_levels(rotated, lattice, 1, translations)[0], ground, atol=1e-9)


def test_spiral_on_lattices_of_several_sites_per_cell():
    """Kagome: the q = 0 120-degree order (every bond turns by 2 pi / 3), the same spectrum, every translation
    kept; honeycomb: the Marshall rotation's H."""
    lattice = hb.kagome(2, total_sz=0)
    ham, plain = (hamiltonians.heisenberg(lattice, phase_prior=p) for p in ("spiral", "none"))
    theta = _angles(ham, lattice.n_sites)
    turns = np.mod(theta[lattice.bonds[:, 0]] - theta[lattice.bonds[:, 1]], 2 * math.pi)
    np.testing.assert_allclose(np.minimum(turns, 2 * math.pi - turns), 2 * math.pi / 3, atol=1e-12)
    # q = 0: one angle per basis site, the same in every cell
    np.testing.assert_allclose(theta.reshape(-1, 3), [[0.0, 2 * math.pi / 3, 4 * math.pi / 3]] * 4, atol=1e-12)
    assert pauli.not_invariant_under(ham, lattice.space_group.rows("translations")) is None
    levels = [exact.lowest_levels(exact.operator(h, lattice), 3) for h in (plain, ham)]
    np.testing.assert_allclose(levels[1], levels[0], atol=1e-9)
    honeycomb = hb.honeycomb(2)
    assert sorted(hamiltonians.heisenberg(honeycomb, phase_prior="spiral").terms) == sorted(
        hamiltonians.heisenberg(honeycomb, phase_prior="marshall").terms)


def test_spiral_refuses_a_graph():
    with pytest.raises(ConfigError, match="a graph has none") as info:
        hamiltonians.heisenberg(hb.graph(4, [[0, 1], [1, 2], [2, 3], [3, 0]]), phase_prior="spiral")
    assert info.value.key == "phase_prior"
