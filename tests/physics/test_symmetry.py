"""Sectors against symmetry operators built here from the configurations: characters, projections,
symmetry-adapted bases and the trace formula for their dimensions, on every lattice type."""

import hashlib

import numpy as np
import pytest

from runner.errors import ConfigError
from runner.physics import hilbert as hb
from runner.physics import spectrum, symmetry

LATTICES = {
    "chain6": lambda: hb.chain(6),
    "chain8_sz0": lambda: hb.chain(8, total_sz=0),
    "chain7_open": lambda: hb.chain(7, pbc=False, total_sz=0.5),
    "square4x2": lambda: hb.square(Lx=4, Ly=2),
    "square3_sz": lambda: hb.square(3, total_sz=0.5),
    "square3x2_open": lambda: hb.square(Lx=3, Ly=2, pbc=False),
    "triangular3": lambda: hb.triangular(3),
    "triangular2x4_sz0": lambda: hb.triangular(Lx=2, Ly=4, total_sz=0),
    "honeycomb2_sz0": lambda: hb.honeycomb(2, total_sz=0),
    "honeycomb3x2_sz1": lambda: hb.honeycomb(Lx=3, Ly=2, total_sz=1),
    "kagome1x3": lambda: hb.kagome(Lx=1, Ly=3),
    "kagome2_sz0": lambda: hb.kagome(2, total_sz=0),
}
# Lattices whose little co-groups all have 1-D irreps only (no C3v, C4v, C6v little group).
ONE_DIMENSIONAL = {"chain6", "chain8_sz0", "chain7_open", "square4x2", "square3x2_open", "triangular2x4_sz0",
                   "honeycomb3x2_sz1", "kagome1x3"}


def _operators(hilbert):
    """g -> the index map of U(g) (U(g) v = v[index]) and the flip's, from the configurations."""
    states = hb.all_states(hilbert)
    row = {s.tobytes(): i for i, s in enumerate(states)}

    def index(images):
        return np.array([row[s.tobytes()] for s in images])

    return states, index, index(-states) if symmetry.parities(hilbert) else None


def _all_sectors(hilbert, group):
    return symmetry.sectors(hilbert, parity=bool(symmetry.parities(hilbert)), stars=False, group=group)


@pytest.mark.parametrize("name", sorted(LATTICES))
def test_bases_are_the_symmetry_eigenspaces(name):
    """Every basis vector of a sector is an eigenvector of each U(g), g in the little group, with
    eigenvalue chi(g) (translations: exp(i k . d) with k from hilbert.momenta); the sector's
    dimension is the trace formula (1/|G'|) sum_g chi(g)* tr U(g)."""
    hilbert = LATTICES[name]()
    group = symmetry.space_group(hilbert)
    states, index, flip = _operators(hilbert)
    images = {e: index(states[:, perm]) for e, perm in enumerate(group.perm_ExN)}
    origin = hilbert.positions[0]
    for sector in _all_sectors(hilbert, group):
        basis = spectrum.sector_basis(hilbert, sector, group).toarray()
        np.testing.assert_allclose(basis.conj().T @ basis, np.eye(basis.shape[1]), atol=1e-12)
        elements, chi = symmetry.characters(group, sector)
        k = hilbert.momenta[np.ravel_multi_index(sector.momentum, group.extents)]
        trace = 0
        for e, c in zip(elements, chi):
            np.testing.assert_allclose(basis[images[e]], c * basis, atol=1e-12)
            if group.op_E[e] == 0:
                shift = hilbert.positions[group.perm_ExN[e][0]] - origin
                np.testing.assert_allclose(c, np.exp(1j * k @ shift), atol=1e-12)
            fixed = np.sum(images[e] == np.arange(len(states)))
            fixed_flipped = np.sum(flip[images[e]] == np.arange(len(states))) if sector.parity else 0
            trace += np.conj(c) * (fixed + (sector.parity or 0) * fixed_flipped)
        if sector.parity is not None:
            np.testing.assert_allclose(basis[flip], sector.parity * basis, atol=1e-12)
            trace /= 2
        np.testing.assert_allclose(trace / len(elements), basis.shape[1], atol=1e-9)


@pytest.mark.parametrize("name", sorted(LATTICES))
def test_sectors_are_orthogonal_and_cover_the_space_without_2d_irreps(name):
    """The bases of all sectors (every momentum) are mutually orthogonal; they span the space
    exactly when no little group has a 2-D irrep, and star representatives count the same."""
    hilbert = LATTICES[name]()
    group = symmetry.space_group(hilbert)
    stacked = np.concatenate([spectrum.sector_basis(hilbert, s, group).toarray()
                              for s in _all_sectors(hilbert, group)], axis=1)
    np.testing.assert_allclose(stacked.conj().T @ stacked, np.eye(stacked.shape[1]), atol=1e-12)
    covered = stacked.shape[1]
    assert (covered == hilbert.n_states) == (name in ONE_DIMENSIONAL) == (not symmetry.with_2d_irreps(group))
    reps = symmetry.sectors(hilbert, parity=bool(symmetry.parities(hilbert)), group=group)
    by_star = sum(spectrum.sector_basis(hilbert, s, group).shape[1] * len(symmetry.star(group, s.momentum))
                  for s in reps)
    assert by_star == covered


@pytest.mark.parametrize("name", ["chain8_sz0", "square4x2", "triangular3", "honeycomb2_sz0", "kagome1x3"])
def test_projector_is_an_orthogonal_projection(name):
    """P v = B B^dagger v; P P v = P v; <u, P v> = <P u, v>; P_a P_b v = 0 for a != b."""
    hilbert = LATTICES[name]()
    group = symmetry.space_group(hilbert)
    rng = np.random.default_rng(0)
    u, v = rng.standard_normal((2, hilbert.n_states)) + 1j * rng.standard_normal((2, hilbert.n_states))
    listed = _all_sectors(hilbert, group)[:8]
    projected = [symmetry.project(hilbert, s, v, group) for s in listed]
    for sector, pv in zip(listed, projected):
        basis = spectrum.sector_basis(hilbert, sector, group)
        np.testing.assert_allclose(pv, basis @ (basis.conj().T @ v), atol=1e-12)
        np.testing.assert_allclose(symmetry.project(hilbert, sector, pv, group), pv, atol=1e-12)
        np.testing.assert_allclose(np.vdot(u, pv), np.vdot(symmetry.project(hilbert, sector, u, group), v), atol=1e-10)
        for other, qv in zip(listed, projected):
            if other != sector:
                np.testing.assert_allclose(symmetry.project(hilbert, sector, qv, group), 0, atol=1e-12)


@pytest.mark.parametrize("name", sorted(LATTICES))
def test_characters_are_orthogonal_homomorphisms(name):
    """sum over G_k of chi_a* chi_b = |G_k| delta_ab, and chi(g h) = chi(g) chi(h) with g h the
    composed maps {R1 R2 | R1 t2 + t1}, whose site permutation is perm_g[perm_h]."""
    hilbert = LATTICES[name]()
    group = symmetry.space_group(hilbert)
    to_cells = np.linalg.inv(group.vectors)
    lookup = {(int(p), tuple(int(x) for x in np.mod(s, group.extents))): e
              for e, (p, s) in enumerate(zip(group.op_E, group.shift_ExD))}
    for momentum in symmetry.momenta(group):
        listed = [s for s in symmetry.sectors(hilbert, group=group, stars=False) if s.momentum == momentum]
        chis = [symmetry.characters(group, s) for s in listed]
        table = np.array([chi for _, chi in chis])
        np.testing.assert_allclose(table.conj() @ table.T, len(chis[0][0]) * np.eye(len(listed)), atol=1e-9)
        elements = list(chis[0][0])
        for g in elements:
            for h in elements[:: max(1, len(elements) // 7)]:
                R1, R2 = group.ops[group.op_E[g]], group.ops[group.op_E[h]]
                op = next(p for p, R in enumerate(group.ops) if np.allclose(R, R1 @ R2))
                rotated = np.round(group.shift_ExD[h] @ group.vectors @ R1.T @ to_cells).astype(int)
                shift = rotated + group.shift_ExD[g]
                gh = lookup[(op, tuple(int(x) for x in np.mod(shift, group.extents)))]
                np.testing.assert_array_equal(group.perm_ExN[gh], group.perm_ExN[g][group.perm_ExN[h]])
                for (els, chi) in chis:
                    pos = {e: i for i, e in enumerate(els)}
                    np.testing.assert_allclose(chi[pos[gh]], chi[pos[g]] * chi[pos[h]], atol=1e-12)


def test_space_group_is_the_one_hilbert_carries_and_centres_on_hexagons():
    for make in LATTICES.values():
        hilbert = make()
        group = symmetry.space_group(hilbert)
        assert group is hilbert.space_group and group == make().space_group and hash(group) == hash(make().space_group)
        lattice_rows = group.rows("lattice")
        assert {tuple(r) for r in group.perm_ExN.tolist()} == {tuple(r) for r in lattice_rows.tolist()}
        assert len({tuple(r) for r in lattice_rows.tolist()}) == len(lattice_rows)
        np.testing.assert_array_equal(group.rows("translations"), hilbert.translations)
        np.testing.assert_array_equal(lattice_rows[:len(hilbert.translations)], hilbert.translations)
        assert group.perm_ExN.shape[0] == len(group.ops) * len(hilbert.translations)
        assert len(set(group.names)) == len(group.perm_ExN) and group.names[0].startswith("{E | (0")
    np.testing.assert_allclose(symmetry.space_group(hb.kagome(2)).center, [0.75, np.sqrt(3) / 4])
    np.testing.assert_allclose(symmetry.space_group(hb.honeycomb(2)).center, [1.0, 1 / np.sqrt(3)])
    np.testing.assert_allclose(symmetry.space_group(hb.triangular(3)).center, [0.0, 0.0])


# sha256[:16] of the int32 rows: (rows("lattice"), perm_ExN) in the orders of the two derivations this
# group replaced (lattice.space_group and symmetry.space_group at 6dc7890): a GCNN's or a symmetric
# RBM's parameters index the elements in these orders.
PINNED_ORDERS = {
    "chain6": (lambda: hb.chain(6), "99575cc727ffd965", "99575cc727ffd965"),
    "square4x2": (lambda: hb.square(Lx=4, Ly=2), "25fb9d94ac29269c", "1af3686c98043e69"),
    "square3": (lambda: hb.square(3), "a07f54382d3a5029", "a07f54382d3a5029"),
    "triangular3": (lambda: hb.triangular(3), "7985a47e10cee66b", "7985a47e10cee66b"),
    "honeycomb2": (lambda: hb.honeycomb(2), "a866bc5112d010f3", "bb209acf65a6db5d"),
    "kagome2": (lambda: hb.kagome(2), "3604263dc55a4c54", "d946f6cc8f842459"),
    "kagome1x3": (lambda: hb.kagome(Lx=1, Ly=3), "8bd444185d520ba6", "162a876f246ff15e"),
    "square3x2_open": (lambda: hb.square(Lx=3, Ly=2, pbc=False), "b0617bb2ec0b9858", "b0617bb2ec0b9858"),
}


@pytest.mark.parametrize("name", sorted(PINNED_ORDERS))
def test_element_orders_are_the_ones_models_index(name):
    make, rows, elements = PINNED_ORDERS[name]
    group = make().space_group

    def digest(a):
        return hashlib.sha256(np.ascontiguousarray(a, np.int32).tobytes()).hexdigest()[:16]

    assert (digest(group.rows("lattice")), digest(group.perm_ExN)) == (rows, elements)


def test_little_groups_and_irrep_names():
    tri = symmetry.space_group(hb.triangular(6))
    assert symmetry.little_group_irreps(tri, (0, 0))[0] == "C6v"
    assert symmetry.little_group_irreps(tri, (3, 0))[0] == "C2v"  # M
    assert list(symmetry.little_group_irreps(tri, (2, 4))[1]) == ["A1", "A2"]  # K: C3v
    assert symmetry.star(tri, (2, 4)) == [(2, 4), (4, 2)]
    assert list(symmetry.little_group_irreps(symmetry.space_group(hb.square(4)), (2, 2))[1]) == ["A1", "A2", "B1", "B2"]
    assert list(symmetry.little_group_irreps(symmetry.space_group(hb.chain(6)), (3,))[1]) == ["A'", "A''"]
    kagome = symmetry.space_group(hb.kagome(Lx=2, Ly=3))
    assert symmetry.irreps(kagome.ops)[0] == "C2"
    assert list(symmetry.little_group_irreps(kagome, (0, 1))[1]) == ["A"]
    assert symmetry.Sector((0, 1), "A1", 1).name == "k=(0,1) A1 P=+1"
    assert symmetry.Sector((3,), "A''").name == "k=(3) A''"


def test_c6v_b1_is_even_under_the_mirror_along_a1():
    group = symmetry.space_group(hb.triangular(3))
    chars = symmetry.irreps(group.ops)[1]
    mirror_a1 = next(p for p, R in enumerate(group.ops) if np.allclose(R, np.diag([1.0, -1.0])))
    assert chars["B1"][mirror_a1] == 1 and chars["B2"][mirror_a1] == -1


def test_parse_sector():
    hilbert = hb.triangular(Lx=2, Ly=4, total_sz=0)
    assert symmetry.parse_sector(None, hilbert) is None and symmetry.parse_sector("auto", hilbert) == "auto"
    sector = symmetry.parse_sector({"momentum": [1, 0], "irrep": "B", "parity": -1}, hilbert)
    assert sector == symmetry.Sector((1, 0), "B", -1, 0.0)
    bad = [
        ("nonsense", "sector", "null, auto or"),
        ({"momentum": [0, 0]}, "sector", "null, auto or"),
        ({"momentum": [2, 0], "irrep": "A"}, "sector.momentum", "0..1, 0..3"),
        ({"momentum": [0, 0, 0], "irrep": "A"}, "sector.momentum", "2 integers"),
        ({"momentum": [1, 0], "irrep": "A1"}, "sector.irrep", "one of A, B, the 1-D irreps of the little group C2"),
        ({"momentum": [0, 0], "irrep": "A1", "parity": 2}, "sector.parity", "null, 1 or -1"),
    ]
    for spec, key, words in bad:
        with pytest.raises(ConfigError, match=words) as info:
            symmetry.parse_sector(spec, hilbert)
        assert info.value.key == key
    with pytest.raises(ConfigError, match="total_sz=1.0 is not 0"):
        symmetry.parse_sector({"momentum": [0, 0], "irrep": "A1", "parity": 1}, hb.triangular(Lx=2, Ly=4, total_sz=1))


def test_a_sector_must_fit_the_space():
    hilbert = hb.chain(6, total_sz=1)
    v = np.ones(hilbert.n_states)
    with pytest.raises(ValueError, match="parity needs total_sz null or 0"):
        symmetry.project(hilbert, symmetry.Sector((0,), "A'", 1), v)
    with pytest.raises(ValueError, match="sz=0.0"):
        spectrum.sector_basis(hilbert, symmetry.Sector((0,), "A'", None, 0.0))


def test_a_graph_has_the_trivial_sector_alone():
    hilbert = hb.graph(4, [[0, 1], [1, 2], [2, 3]], total_sz=0)
    listed = symmetry.sectors(hilbert, parity=True)
    assert listed == [symmetry.Sector((0,), "A", 1, 0.0), symmetry.Sector((0,), "A", -1, 0.0)]
    basis = spectrum.sector_basis(hilbert, symmetry.Sector((0,), "A", 1, 0.0)).toarray()
    assert basis.shape == (6, 3)
