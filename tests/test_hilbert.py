"""Lattices: distance shells against hand counts, geometry, translations, momenta, small tori."""

import math

import numpy as np
import pytest

from runner import hilbert as hb
from runner.errors import ConfigError


def _coordination(n_sites, pairs):
    return sorted(set(np.bincount(np.asarray(pairs).ravel(), minlength=n_sites).tolist()))


# (lattice, bonds, next_bonds, coordination {first}, {second}); open counts by hand from the
# neighbour vectors (square: a1, a2 | a1 +- a2; triangular: a1, a2, a2 - a1 | a1 + a2, 2a2 - a1,
# 2a1 - a2; honeycomb: A-B three ways | the triangular first shell per sublattice; kagome:
# the triangle bonds | distance sqrt3/2).
PERIODIC = [
    (lambda: hb.chain(8), 8, 8, [2], [2]),
    (lambda: hb.square(4), 32, 32, [4], [4]),
    (lambda: hb.triangular(4), 48, 48, [6], [6]),
    (lambda: hb.honeycomb(3), 27, 54, [3], [6]),
    (lambda: hb.honeycomb(4), 48, 96, [3], [6]),
    (lambda: hb.kagome(3), 54, 54, [4], [4]),
    (lambda: hb.kagome(Lx=4, Ly=3), 72, 72, [4], [4]),
]
OPEN = [
    (lambda: hb.chain(8, pbc=False), 7, 6),
    (lambda: hb.square(Lx=3, Ly=4, pbc=False), 3 * 3 + 2 * 4, 2 * 2 * 3),
    (lambda: hb.triangular(3, pbc=False), 6 + 6 + 4, 4 + 2 + 2),
    (lambda: hb.honeycomb(2, pbc=False), 4 + 2 + 2, 2 * (2 + 2 + 1)),
    (lambda: hb.kagome(1, pbc=False), 3, 0),
    (lambda: hb.kagome(Lx=2, Ly=1, pbc=False), 7, 2),
]


@pytest.mark.parametrize("make,n_bonds,n_next,coord,coord2", PERIODIC)
def test_periodic_shells_have_the_infinite_lattice_coordination(make, n_bonds, n_next, coord, coord2):
    lattice = make()
    assert len(lattice.bonds) == n_bonds and len(lattice.next_bonds) == n_next
    assert _coordination(lattice.n_sites, lattice.bonds) == coord
    assert _coordination(lattice.n_sites, lattice.next_bonds) == coord2
    assert lattice.next_bonds_issue is None
    for pairs in (lattice.bonds, lattice.next_bonds):
        assert np.all(pairs[:, 0] < pairs[:, 1])
        assert [tuple(p) for p in pairs] == sorted({tuple(p) for p in pairs})


@pytest.mark.parametrize("make,n_bonds,n_next", OPEN)
def test_open_shells_match_hand_counts(make, n_bonds, n_next):
    lattice = make()
    assert (len(lattice.bonds), len(lattice.next_bonds)) == (n_bonds, n_next)
    assert lattice.translations.shape == (1, lattice.n_sites)


@pytest.mark.parametrize("make", [p[0] for p in PERIODIC] + [o[0] for o in OPEN])
def test_shells_are_distance_shells_of_the_positions(make):
    """Open lattices: bonds / next_bonds are exactly the pairs at the two smallest distances."""
    lattice = make()
    if lattice.pbc:
        return
    pos = lattice.positions
    dist = np.linalg.norm(pos[:, None] - pos[None], axis=-1).round(9)
    shells = sorted(set(dist[np.triu_indices(lattice.n_sites, 1)]))
    for pairs, d in ((lattice.bonds, shells[0]), (lattice.next_bonds, shells[1] if len(shells) > 1 else None)):
        expected = {(i, j) for i, j in zip(*np.triu_indices(lattice.n_sites, 1)) if dist[i, j] == d}
        assert {tuple(p) for p in pairs} == expected


def test_positions_and_site_index():
    s3 = math.sqrt(3) / 2
    honey = hb.honeycomb(Lx=3, Ly=2)
    x, y, b = 2, 1, 1
    np.testing.assert_allclose(honey.positions[(x * 2 + y) * 2 + b], x * np.array([1, 0]) + y * np.array([0.5, s3])
                               + np.array([1.5, s3]) / 3)
    kag = hb.kagome(2)
    np.testing.assert_allclose(kag.positions[(1 * 2 + 1) * 3 + 2], [1.5, s3] + np.array([0.25, s3 / 2]))
    assert hb.chain(5).positions.shape == (5, 1)
    np.testing.assert_allclose(hb.square(Lx=2, Ly=3).positions[1 * 3 + 2], [1, 2])


@pytest.mark.parametrize("make", [p[0] for p in PERIODIC])
def test_translations_are_symmetries(make):
    lattice = make()
    n_cells = math.prod(lattice.shape)
    assert lattice.translations.shape == (n_cells, lattice.n_sites)
    np.testing.assert_array_equal(lattice.translations[0], np.arange(lattice.n_sites))
    assert len({tuple(t) for t in lattice.translations}) == n_cells
    for perm in lattice.translations:
        assert sorted(perm) == list(range(lattice.n_sites))
        for pairs in (lattice.bonds, lattice.next_bonds):
            moved = {tuple(sorted(p)) for p in perm[pairs]}
            assert moved == {tuple(p) for p in pairs}


@pytest.mark.parametrize("make", [p[0] for p in PERIODIC])
def test_momenta_are_the_torus_reciprocal_grid(make):
    lattice = make()
    cells = math.prod(lattice.shape)
    assert lattice.momenta.shape == (cells, lattice.positions.shape[1])
    # exp(i q . R) = 1 for the torus periods R, and distinct q give orthogonal plane waves
    # on the unit-cell origins (sites of basis 0).
    n_basis = lattice.n_sites // cells
    origins = lattice.positions[::n_basis]
    waves = np.exp(1j * origins @ lattice.momenta.T)
    np.testing.assert_allclose(waves.conj().T @ waves, cells * np.eye(cells), atol=1e-9)
    period = lattice.positions[lattice.translations[1]][::n_basis] - origins  # one-cell shift
    assert np.allclose(np.exp(1j * lattice.momenta @ period[0]) ** lattice.shape[-1], 1)


def test_sublattice_two_colouring():
    assert hb.honeycomb(3).sublattice is not None
    assert hb.square(4).sublattice is not None and hb.square(3).sublattice is None
    assert hb.triangular(4).sublattice is None and hb.kagome(2).sublattice is None
    colours = hb.honeycomb(2).sublattice
    assert np.all(colours[hb.honeycomb(2).bonds[:, 0]] != colours[hb.honeycomb(2).bonds[:, 1]])


def test_small_tori_follow_the_image_convention():
    # a pair reached through several images of one shell is one bond
    np.testing.assert_array_equal(hb.chain(4).next_bonds, [[0, 2], [1, 3]])
    assert len(hb.square(2).bonds) == 4 and len(hb.square(2).next_bonds) == 2
    assert len(hb.triangular(3).next_bonds) == 9
    # a pair in both shells, or a site its own second neighbour, leaves next_bonds unusable
    assert hb.chain(3).next_bonds_issue is not None
    np.testing.assert_array_equal(hb.chain(3).next_bonds, hb.chain(3).bonds)
    assert "both" in hb.triangular(2).next_bonds_issue
    assert "own next-nearest" in hb.honeycomb(Lx=1, Ly=3).next_bonds_issue
    assert hb.chain(5).next_bonds_issue is None and hb.kagome(2).next_bonds_issue is None


@pytest.mark.parametrize(
    "make,key",
    [
        (lambda: hb.triangular(1), "L"),
        (lambda: hb.square(Lx=1, Ly=4), "Lx"),
        (lambda: hb.kagome(Lx=2, Ly=0), "Ly"),
        (lambda: hb.honeycomb(), "L"),
        (lambda: hb.kagome(2, total_sz=0.5), "total_sz"),
        (lambda: hb.graph(3, [[0, 3]]), "edges"),
        (lambda: hb.graph(3, [[1, 1]]), "edges"),
        (lambda: hb.graph(3, [[0, 1]], positions=[[0.0], [1.0]]), "positions"),
        (lambda: hb.chain(3, pbc="yes"), "pbc"),
    ],
)
def test_bad_lattices_raise_config_error(make, key):
    with pytest.raises(ConfigError) as info:
        make()
    assert info.value.key == key


def test_open_extent_one_is_allowed():
    assert len(hb.square(Lx=1, Ly=4, pbc=False).bonds) == 3
    assert len(hb.honeycomb(1).bonds) == 1  # A-B reached through three images: one bond


def test_graph():
    g = hb.graph(4, [[0, 1], [1, 0], [1, 2], [3, 2]], next_edges=[[0, 2]], positions=[[0, 0], [1, 0], [1, 1], [0, 1]])
    np.testing.assert_array_equal(g.bonds, [[0, 1], [1, 2], [2, 3]])
    np.testing.assert_array_equal(g.next_bonds, [[0, 2]])
    assert g.sublattice is not None and g.next_bonds_issue is None and g.positions.shape == (4, 2)
    assert g.translations.shape == (1, 4) and g.momenta.shape == (1, 2)
    assert "both" in hb.graph(3, [[0, 1], [1, 2]], next_edges=[[1, 0]]).next_bonds_issue
    assert hb.graph(3, [[0, 1], [1, 2], [0, 2]]).sublattice is None
