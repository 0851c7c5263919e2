"""Per-sector levels against dense diagonalisation of P H P, the full spectrum as the union of the
sectors, and the known ground sectors of frustrated lattices."""

import json
import math

import numpy as np
import pytest

from runner.physics import exact, hamiltonians, pauli, spectrum, symmetry
from runner.physics import hilbert as hb
from tests.helpers.dense import basis_index, dense_pauli


def _dense_h(hilbert, ham):
    """H on the (Sz) space of `hilbert` from Kronecker products (<= 10 sites) or the Pauli sum."""
    states = hb.all_states(hilbert)
    if hilbert.n_sites > 10:
        return pauli.to_sparse(ham, states).toarray()
    full = dense_pauli(ham.terms, hilbert.n_sites)
    idx = basis_index(states)
    return full[np.ix_(idx, idx)]


def _dense_projector(hilbert, sector, group):
    """(1/|G_k|) sum_g chi(g)* U(g) (1 + parity F) / 2 from index maps of the configurations."""
    states = hb.all_states(hilbert)
    row = {s.tobytes(): i for i, s in enumerate(states)}

    def index(images):
        return np.array([row[s.tobytes()] for s in images])

    elements, chi = symmetry.characters(group, sector)
    P = np.zeros((len(states), len(states)), complex)
    for e, c in zip(elements, chi):
        np.add.at(P, (np.arange(len(states)), index(states[:, group.perm_ExN[e]])), np.conj(c) / len(elements))
    if sector.parity is not None:
        P = (P + sector.parity * P[:, index(-states)]) / 2
    return P


CASES = {
    "chain10_j1j2": (lambda: hb.chain(10, total_sz=0), lambda h: hamiltonians.heisenberg(h, 1.0, 0.3, "none")),
    "square4x2_ising": (lambda: hb.square(Lx=4, Ly=2), lambda h: hamiltonians.ising(h, 1.0, 0.7)),
    "chain8_xxz_field": (lambda: hb.chain(8), lambda h: hamiltonians.xxz(h, 1.0, 0.5, 0.3)),
    "triangular3": (lambda: hb.triangular(3, total_sz=0.5), lambda h: hamiltonians.heisenberg(h, 1.0, 0.0, "none")),
    "honeycomb2": (lambda: hb.honeycomb(2, total_sz=0), lambda h: hamiltonians.heisenberg(h, 1.0, 0.0, "none")),
    "kagome1x3": (lambda: hb.kagome(Lx=1, Ly=3, total_sz=0.5), lambda h: hamiltonians.heisenberg(h, 1.0, 0.0, "none")),
    "kagome2": (lambda: hb.kagome(2, total_sz=2), lambda h: hamiltonians.heisenberg(h, 1.0, 0.0, "none")),
    "square4x2_marshall": (lambda: hb.square(Lx=4, Ly=2, total_sz=1),
                           lambda h: hamiltonians.heisenberg(h, 1.0, 0.2, "marshall")),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_levels_match_dense_diagonalisation_of_each_sector(name):
    """Every level of every sector equals the spectrum of H on the range of the dense projector."""
    make_hilbert, make_ham = CASES[name]
    hilbert = make_hilbert()
    ham = make_ham(hilbert)
    H = _dense_h(hilbert, ham)
    group = symmetry.space_group(hilbert)
    result = spectrum.spectrum(ham, hilbert, n_levels=None)
    for sector, levels in result.levels.items():
        w, v = np.linalg.eigh(_dense_projector(hilbert, sector, group))
        V = v[:, w > 0.5]
        assert V.shape[1] == result.dims[sector] == len(levels)
        np.testing.assert_allclose(levels, np.linalg.eigvalsh(V.conj().T @ H @ V), atol=1e-9)


@pytest.mark.parametrize("name", ["chain10_j1j2", "square4x2_ising", "chain8_xxz_field", "kagome1x3"])
def test_full_spectrum_is_the_union_of_the_sectors(name):
    """Without 2-D irreps, the levels of the star representatives, each counted once per momentum
    of its star, are the whole spectrum."""
    make_hilbert, make_ham = CASES[name]
    hilbert = make_hilbert()
    ham = make_ham(hilbert)
    result = spectrum.spectrum(ham, hilbert, n_levels=None)
    assert result.uncovered_states == 0
    union = np.sort(np.concatenate([np.repeat(v, result.star_sizes[s]) for s, v in result.levels.items()]))
    np.testing.assert_allclose(union, np.linalg.eigvalsh(_dense_h(hilbert, ham)), atol=1e-9)


def test_parity_follows_the_hamiltonian():
    with_flip = spectrum.spectrum(*_case("square4x2_ising"))
    assert {s.parity for s in with_flip.levels} == {1, -1}
    without = spectrum.spectrum(*_case("chain8_xxz_field"))
    assert {s.parity for s in without.levels} == {None}
    with pytest.raises(ValueError, match="spin flip"):
        spectrum.spectrum(*_case("chain8_xxz_field"), parity=True)
    with pytest.raises(ValueError, match="total_sz null or 0"):
        spectrum.spectrum(*_case("kagome1x3"), parity=True)


def _case(name):
    make_hilbert, make_ham = CASES[name]
    hilbert = make_hilbert()
    return make_ham(hilbert), hilbert


def test_refuses_a_hamiltonian_without_the_lattice_symmetry():
    """A field on one site breaks the translations: refused, and indeed H P v != P H v there."""
    hilbert = hb.chain(8)
    symmetric = hamiltonians.heisenberg(hilbert, 1.0, 0.0, "none")
    broken = pauli.pauli_sum(8, list(symmetric.terms) + [(0.3, "Z", (0,))])
    with pytest.raises(ValueError, match=r"does not commute with space-group element 1 \{E \| \(1\)\}"):
        spectrum.spectrum(broken, hilbert)
    sector = symmetry.Sector((1,), "A")
    v = np.random.default_rng(0).standard_normal(hilbert.n_states)

    def commutator(ham):
        matvec = exact.matvec_of(ham, hilbert)
        hpv = matvec(symmetry.project(hilbert, sector, v))
        return np.linalg.norm(hpv - symmetry.project(hilbert, sector, matvec(v)))

    assert commutator(symmetric) < 1e-12 and commutator(broken) > 1e-2


def test_ground_state_in_a_2d_irrep_has_no_sector():
    """On the 3x3 square torus (Sz = 3/2) the XY J1-J2 ground state lies in a 2-D irrep (E of
    C4v at k = 0): every listed sector lies higher, and ground_sector says so."""
    hilbert = hb.square(3, total_sz=1.5)
    terms = [(1.0, ops, b) for b in hilbert.bonds for ops in ("XX", "YY")]
    ham = pauli.pauli_sum(9, terms + [(0.5, ops, b) for b in hilbert.next_bonds for ops in ("XX", "YY", "ZZ")])
    result = spectrum.spectrum(ham, hilbert)
    exact_ground = np.linalg.eigvalsh(_dense_h(hilbert, ham))[0]
    assert result.uncovered_states > 0 and result.with_2d_irreps == {(0, 0): "C4v"}
    assert min(v[0] for v in result.levels.values() if v) > exact_ground + 0.1
    sector, energy = spectrum.ground_sector(ham, hilbert, result)
    assert sector is None
    np.testing.assert_allclose(energy, exact_ground, rtol=1e-10)
    assert spectrum.to_json(result, (sector, energy))["ground_sector"] is None


def test_kagome_2x2_ground_state_is_b1_at_gamma():
    """Kagome 2x2 Heisenberg, Sz = 0: ground state -21.7795 at k = 0 in B1 of C6v; the lowest
    fully symmetric level is -21.3136."""
    hilbert = hb.kagome(2, total_sz=0)
    ham = hamiltonians.heisenberg(hilbert, 1.0, 0.0, "none")
    result = spectrum.spectrum(ham, hilbert, n_levels=2)
    sector, energy = spectrum.ground_sector(ham, hilbert, result)
    assert sector == symmetry.Sector((0, 0), "B1", 1, 0.0)
    np.testing.assert_allclose(energy, -21.7795, atol=5e-5)
    np.testing.assert_allclose(energy, exact.ground_energy(ham, hilbert), rtol=1e-10)
    np.testing.assert_allclose(result.levels[symmetry.Sector((0, 0), "A1", 1, 0.0)][0], -21.3136, atol=5e-5)
    out = json.loads(json.dumps(spectrum.to_json(result, (sector, energy))))
    assert out["ground_sector"] == "k=(0,0) B1 P=+1" and len(out["levels"]["k=(0,1) A2 P=-1"]) == 2
    assert out["uncovered_states"] == result.uncovered_states > 0
    assert out["with_2d_irreps"] == {"k=(0,0)": "C6v"}  # k=(0,1): C2v, 1-D irreps only


def test_triangular_4x4_ground_state_is_fully_symmetric():
    hilbert = hb.triangular(4, total_sz=0)
    ham = hamiltonians.heisenberg(hilbert, 1.0, 0.0, "none")
    sector, energy = spectrum.ground_sector(ham, hilbert)
    assert sector == symmetry.Sector((0, 0), "A1", 1, 0.0)
    np.testing.assert_allclose(energy, -34.2220597, atol=1e-7)


def test_kagome_2x3_ground_state_has_nonzero_momentum():
    """Kagome 2x3 (18 sites, Sz = 0, 48620 states): ground state -32.1930831 at k = b1/2, odd
    under the flip (a singlet of 18 spins); the lowest space-group-invariant level -32.0332510."""
    hilbert = hb.kagome(Lx=2, Ly=3, total_sz=0)
    ham = hamiltonians.heisenberg(hilbert, 1.0, 0.0, "none")
    result = spectrum.spectrum(ham, hilbert)
    assert result.uncovered_states == 0
    sector, energy = spectrum.ground_sector(ham, hilbert, result)
    assert sector == symmetry.Sector((1, 0), "A", -1, 0.0)
    np.testing.assert_allclose(energy, -32.1930831, atol=1e-7)
    np.testing.assert_allclose(result.levels[symmetry.Sector((0, 0), "A", -1, 0.0)][0], -32.0332510, atol=1e-7)


@pytest.mark.parametrize("name", ["chain10_j1j2", "square4x2_ising", "kagome1x3"])
def test_lowest_levels_in_a_sector_are_its_dense_levels(name):
    """`lowest_levels_in` of each sector: the sector's own lowest levels from the dense projector;
    without a sector, the space's (dense eigvalsh)."""
    make_hilbert, make_ham = CASES[name]
    hilbert = make_hilbert()
    ham = make_ham(hilbert)
    H = _dense_h(hilbert, ham)
    group = symmetry.space_group(hilbert)
    np.testing.assert_allclose(spectrum.lowest_levels_in(ham, hilbert, 4), np.linalg.eigvalsh(H)[:4], atol=1e-9)
    for sector in symmetry.sectors(hilbert, group=group)[:4]:
        w, v = np.linalg.eigh(_dense_projector(hilbert, sector, group))
        V = v[:, w > 0.5]
        dense = np.linalg.eigvalsh(V.conj().T @ H @ V)[:3]
        np.testing.assert_allclose(spectrum.lowest_levels_in(ham, hilbert, 3, sector), dense, atol=1e-9)
        assert spectrum.sector_matrix(ham, hilbert, sector).shape[0] == V.shape[1]


@pytest.mark.parametrize("name", sorted(CASES))
def test_sector_dimension_by_characters_is_the_basis_size(name):
    """The character formula (fixed configurations by cycle type) gives every sector's dimension,
    with and without parity, as the orbits' basis does."""
    hilbert = CASES[name][0]()
    group = symmetry.space_group(hilbert)
    listed = symmetry.sectors(hilbert, parity=bool(symmetry.parities(hilbert)), stars=False, group=group)
    if symmetry.parities(hilbert):
        listed += symmetry.sectors(hilbert, stars=False, group=group)
    for sector in listed:
        assert spectrum.sector_dimension(hilbert, sector, group) == spectrum.sector_basis(hilbert, sector, group).shape[1]


def test_sector_dimension_of_a_space_too_large_to_enumerate():
    """6x6 square, Sz = 0 (9.1e9 configurations): the dimensions of the momentum sectors without a
    point group (translations only, every element's cycles known) are Burnside's counts; the trivial
    sector of the full space group lies near C(36, 18) / (36 * 8 * 2)."""
    space = hb.square(6, total_sz=0)
    trivial = symmetry.Sector(momentum=(0, 0), irrep="A1", parity=1)
    d = spectrum.sector_dimension(space, trivial)
    assert abs(d / (9075135300 / 576) - 1) < 0.01
    chain = hb.chain(24, total_sz=0)  # translations: k = 0 holds sum over divisors, by Burnside
    burnside = sum(_euler_phi(24 // c) * math.comb(c, c // 2) for c in range(2, 25, 2) if 24 % c == 0) // 24
    k0 = [s for s in symmetry.sectors(chain, stars=False) if s.momentum == (0,)]
    assert sum(spectrum.sector_dimension(chain, s) for s in k0) == burnside


def _euler_phi(n):
    return sum(1 for j in range(1, n + 1) if math.gcd(j, n) == 1)


@pytest.mark.parametrize("symmetric", [True, False], ids=["symmetric_h", "h_without_the_symmetry"])
def test_invariant_levels_are_those_of_the_invariant_states_and_parity(symmetric):
    """`invariant_levels` against dense diagonalisation of P H P on the states invariant under a
    group of site permutations (the chain's translations), with and without a spin-flip parity; also
    for an H that lacks the symmetry (a field Z + X on site 0 added), where P H P is not H's
    restriction and a representative's row does not give it."""
    space = hb.chain(6)
    ham = hamiltonians.ising(space, h=2.0)
    if not symmetric:
        ham = pauli.pauli_sum(6, [*((c, ops, sites) for c, ops, sites in ham.terms), (0.7, "Z", (0,)), (0.4, "X", (0,))])
    states = hb.all_states(space)
    index = {tuple(s): i for i, s in enumerate(states.tolist())}
    rows = np.asarray(space.translations)
    dense = pauli.to_sparse(ham, states).toarray()
    for parity in (None, 1, -1):
        images = [(perm, 1) for perm in rows] + ([(perm, -1) for perm in rows] if parity else [])
        average = np.zeros((len(states), len(states)))
        for perm, sign in images:
            moved = [index[tuple(s)] for s in (sign * states[:, perm]).tolist()]
            average[moved, np.arange(len(states))] += (parity if sign < 0 else 1) / len(images)
        u, sv, _ = np.linalg.svd(average)
        basis = u[:, sv > 1e-9]
        want = np.linalg.eigvalsh(basis.T @ dense @ basis)[:4]
        assert spectrum.invariant_levels(ham, space, 4, rows, parity) == pytest.approx(want, abs=1e-10)


def test_of_degenerate_sectors_the_first_is_the_ground_sector_whatever_the_last_bits():
    """Sectors whose lowest levels agree within rtol are one degenerate level: the first in order is
    the ground sector, not the one a processor's rounding puts lowest (the 3 x 3 triangular torus with
    the three-sublattice prior: k=(0,0) A1 on one CPU, k=(1,2) A1 on another)."""
    first, second, third = "k=(0,0) A1", "k=(1,2) A1", "k=(0,1) A1"
    for tie in (-21.0 - 3e-15, -21.0 + 3e-15):
        result = spectrum.Spectrum({first: [-21.0], second: [tie], third: [-20.0]}, {first: 1, second: 1, third: 1},
                                   {first: 1, second: 1, third: 1}, 3, {})
        assert spectrum._ground_sector(None, None, result, 1e-9) == (first, -21.0)
    result = spectrum.Spectrum({first: [-21.0], second: [-21.0 - 1e-6]}, {first: 1, second: 1}, {first: 1, second: 1},
                               2, {})
    assert spectrum._ground_sector(None, None, result, 1e-9)[0] == second
