"""Lattices: distance shells against hand counts, geometry, translations, momenta, small tori."""

import math

import numpy as np
import pytest

from runner.errors import ConfigError
from runner.physics import hilbert as hb
from tests.helpers import dense


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


# Space groups: (lattice, order G[, automorphisms of its two bond graphs where they have more]).
# The point group (chain: reflection; square: C4v; triangular, honeycomb, kagome: C6v) times the
# L^d translations, fewer where the finite lattice breaks a point operation (Lx != Ly, open
# boundaries) or two elements coincide.
SPACE_GROUPS = [
    (lambda: hb.chain(5), 10),
    (lambda: hb.chain(8), 16),
    (lambda: hb.chain(7, pbc=False), 2),
    (lambda: hb.square(2), 8),  # 32 maps, 8 distinct permutations of 4 sites
    (lambda: hb.square(4), 128),
    (lambda: hb.square(6), 288),
    (lambda: hb.square(Lx=4, Ly=6), 4 * 24),  # C2v
    (lambda: hb.square(4, pbc=False), 8),
    (lambda: hb.square(Lx=3, Ly=4, pbc=False), 4),
    (lambda: hb.triangular(3), 108, 1296),
    (lambda: hb.triangular(4), 192),
    (lambda: hb.honeycomb(2), 48),
    (lambda: hb.honeycomb(3), 108, 216),
    (lambda: hb.kagome(2), 48),
    (lambda: hb.kagome(3), 108),
]


def _count_automorphisms(n_sites, bonds, next_bonds):
    """Permutations keeping bonds and next_bonds (an edge-coloured graph), by backtracking."""
    colour = {}
    for shell, pairs in ((1, bonds), (2, next_bonds)):
        for i, j in np.asarray(pairs).tolist():
            colour[i, j] = colour[j, i] = shell
    order = [0]  # breadth first, so each site is checked against neighbours placed before it
    for i in order:
        order += [j for j in range(n_sites) if (i, j) in colour and j not in order]
    order += [j for j in range(n_sites) if j not in order]
    image = {}

    def extend(k):
        if k == n_sites:
            return 1
        i, total = order[k], 0
        for c in set(range(n_sites)) - set(image.values()):
            if all(colour.get((i, j), 0) == colour.get((c, image[j]), 0) for j in order[:k]):
                image[i] = c
                total += extend(k + 1)
                del image[i]
        return total

    return extend(0)


@pytest.mark.parametrize("make,order", [s[:2] for s in SPACE_GROUPS])
def test_space_group_is_a_group_of_lattice_automorphisms(make, order):
    lattice = make()
    group = lattice.space_group.rows("lattice")
    assert group.shape == (order, lattice.n_sites) and group.dtype == np.int32
    np.testing.assert_array_equal(group[0], np.arange(lattice.n_sites))
    np.testing.assert_array_equal(group[: len(lattice.translations)], lattice.translations)
    rows = {tuple(g) for g in group.tolist()}
    assert len(rows) == order
    for g in group:
        assert sorted(g) == list(range(lattice.n_sites))
        for pairs in (lattice.bonds, lattice.next_bonds):
            assert {tuple(p) for p in np.sort(g[pairs], axis=-1).tolist()} == {tuple(p) for p in pairs.tolist()}
        assert tuple(np.argsort(g).tolist()) in rows  # the inverse
    products = {tuple(g[h].tolist()) for g in group for h in group}  # closure
    assert products == rows


@pytest.mark.parametrize("make,automorphisms", [(s[0], s[2] if len(s) > 2 else None) for s in SPACE_GROUPS])
def test_space_group_against_brute_force_automorphisms(make, automorphisms):
    """Where the finite lattice has no accidental symmetry, the geometric space group is every
    permutation that keeps both bond shells; on the 3x3 triangular and honeycomb tori the
    graphs have more (all 9 triangular sites are first or second neighbours: 1296 vs 108;
    honeycomb 216 vs 108), which are not lattice symmetries and are left out."""
    lattice = make()
    count = _count_automorphisms(lattice.n_sites, lattice.bonds, lattice.next_bonds)
    assert count == (automorphisms or len(lattice.space_group.rows("lattice")))


def test_space_group_keeps_c2v_on_rectangles_and_open_clusters():
    rectangle = hb.square(Lx=4, Ly=6)
    pos = rectangle.positions
    for g in rectangle.space_group.rows("lattice"):
        # the map is affine with a linear part in C2v: displacements keep |dx| and |dy|
        for i, j in ((0, 5), (0, 7), (3, 22)):
            d_old, d_new = np.abs(pos[j] - pos[i]), np.abs(pos[g[j]] - pos[g[i]])
            np.testing.assert_allclose(np.minimum(d_new, [4, 6] - d_new), np.minimum(d_old, [4, 6] - d_old))
    # an open square keeps the 8 operations about its centre: the distance to it is kept
    open_square = hb.square(4, pbc=False)
    centre = open_square.positions.mean(axis=0)
    radius = np.linalg.norm(open_square.positions - centre, axis=-1)
    for g in open_square.space_group.rows("lattice"):
        np.testing.assert_allclose(radius[g], radius)


def test_graph_space_group_is_the_identity():
    g = hb.graph(3, [[0, 1], [1, 2]])
    np.testing.assert_array_equal(g.space_group.rows("lattice"), [[0, 1, 2]])


def _heisenberg_sector(lattice, J2, rotate):
    """The J1-J2 Heisenberg H (Paulis) on the Sz = 0 sector as a sparse matrix, built from its
    matrix elements: diagonal J s_i s_j, and 2 J between states differing by an exchanged
    antiparallel pair; `rotate` applies the Marshall rotation U = prod_{i in sublattice 1} Z_i."""
    import scipy.sparse

    hilbert = lattice._replace(total_sz=0.0)
    states = hb.all_states(hilbert).astype(np.int64)
    codes = hb.states_to_codes(states)
    rows, cols, vals = [np.arange(len(states))], [np.arange(len(states))], [np.zeros(len(states))]
    for pairs, coupling in ((lattice.bonds, 1.0), (lattice.next_bonds, J2)):
        for i, j in pairs:
            vals[0] = vals[0] + coupling * states[:, i] * states[:, j]
            flip = states[:, i] != states[:, j]
            swapped = states[flip].copy()
            swapped[:, [i, j]] = swapped[:, [j, i]]
            rows.append(np.nonzero(flip)[0])
            cols.append(np.searchsorted(codes, hb.states_to_codes(swapped)))
            vals.append(np.full(flip.sum(), 2.0 * coupling))
    H = scipy.sparse.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                                shape=(len(states),) * 2)
    if rotate:
        u = np.prod(np.where(lattice.sublattice[None, :] == 1, states, 1), axis=-1).astype(float)
        H = scipy.sparse.diags(u) @ H @ scipy.sparse.diags(u)
    return H, states, codes


def _permuted_index(states, codes, perm):
    """Index of the configuration s[perm] for each configuration s of the sector."""
    return np.searchsorted(codes, hb.states_to_codes(states[:, perm]))


def test_triangular_j1j2_dense_hamiltonian_commutes_with_the_space_group():
    lattice = hb.triangular(3)
    terms = [(J, P + P, pair) for pairs, J in ((lattice.bonds, 1.0), (lattice.next_bonds, 0.5))
             for pair in pairs.tolist() for P in "XYZ"]
    H = dense.dense_pauli(terms, 9)
    states = hb.all_states(lattice)
    rows = dense.basis_index(states)
    assert np.abs(H).max() > 0
    for g in lattice.space_group.rows("lattice"):
        moved = np.empty_like(rows)
        moved[rows] = dense.basis_index(states[:, g])  # P |s> = |s[g]>; P H P^-1 = H elementwise
        np.testing.assert_allclose(H[np.ix_(moved, moved)], H, atol=1e-12)


@pytest.mark.parametrize("rotate", [False, True])
def test_square_j1j2_commutes_with_the_space_group_and_marshall_rotation(rotate):
    """4x4 J1-J2 (J2 = 0.5) in the Sz = 0 sector, plain and Marshall-rotated: H commutes with
    every space-group permutation, and the ground state is the trivial representation in both
    (N/2 = 8 even: U and the permutations commute on the sector)."""
    import scipy.sparse.linalg

    lattice = hb.square(4)
    H, states, codes = _heisenberg_sector(lattice, 0.5, rotate)
    v = np.random.default_rng(0).normal(size=(len(states), 3))
    for g in lattice.space_group.rows("lattice"):
        index = _permuted_index(states, codes, g)
        np.testing.assert_allclose((H @ v)[index], H @ v[index], atol=1e-10)
    energies, vectors = scipy.sparse.linalg.eigsh(H, k=2, which="SA", tol=1e-12)
    assert energies[1] - energies[0] > 0.1  # a unique ground state
    psi = vectors[:, 0]
    for g in lattice.space_group.rows("lattice"):
        np.testing.assert_allclose(psi[_permuted_index(states, codes, g)], psi, atol=1e-8)


def test_square_j1j2_ground_state_sign_structure():
    """The numbers docs/notes/accuracy.md quotes for the 4x4 J1-J2 ground state (J2 = 0.5, Sz = 0,
    Marshall-rotated): spin-flip parity +1, gap 1.276, the Marshall sign wrong on 1.3 % of its
    weight, and the exact amplitudes with the Marshall sign alone 2.2e-2 above the exact energy."""
    import scipy.sparse.linalg

    H, states, codes = _heisenberg_sector(hb.square(4), 0.5, rotate=True)
    energies, vectors = scipy.sparse.linalg.eigsh(H, k=2, which="SA", tol=1e-12)
    psi = vectors[:, 0] * np.sign(vectors[np.argmax(np.abs(vectors[:, 0])), 0])
    assert energies[0] == pytest.approx(-33.8316934056, abs=1e-8)
    assert energies[1] - energies[0] == pytest.approx(1.276, abs=1e-3)
    np.testing.assert_allclose(psi[np.searchsorted(codes, hb.states_to_codes(-states))], psi, atol=1e-8)
    assert np.sum(psi[psi < 0] ** 2) == pytest.approx(0.0127, abs=1e-4)
    marshall_only = np.abs(psi)
    energy = marshall_only @ (H @ marshall_only)
    assert energy == pytest.approx(-33.0916, abs=1e-4)
    assert (energy - energies[0]) / abs(energies[0]) == pytest.approx(2.2e-2, abs=1e-3)


@pytest.mark.parametrize("L", [4, 6])
def test_space_group_maps_the_sublattices_onto_themselves_or_each_other(L):
    """Every element keeps or swaps the Marshall sublattices, so with U = prod_{i in B} Z_i,
    U P U P^-1 is 1 or prod_i Z_i = (-1)^(N/2) on the Sz = 0 sector: 1 for N/2 even (16 and
    36 sites), so the rotation commutes with the whole space group there."""
    lattice = hb.square(L)
    swaps = 0
    for g in lattice.space_group.rows("lattice"):
        moved = lattice.sublattice[np.argsort(g)]  # colour of the site each site comes from
        assert np.all(moved == lattice.sublattice) or np.all(moved != lattice.sublattice)
        swaps += int(np.all(moved != lattice.sublattice))
    assert swaps == len(lattice.space_group.rows("lattice")) // 2 and (lattice.n_sites // 2) % 2 == 0
