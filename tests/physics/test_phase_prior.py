"""Phase priors (`hamiltonian.phase_prior`): the fixed diagonal unitaries U of heisenberg (Marshall, the
three-sublattice 120-degree pattern) against dense U H U^dagger and exact spectra, their refusals, the
symmetries the rotated H keeps, and the old `sign_rule` spelling."""

import math

import numpy as np
import pytest

from runner.config import compose, fingerprint
from runner.config.build import build
from runner.errors import ConfigError
from runner.physics import exact, hamiltonians, pauli, spectrum
from runner.physics import hilbert as hb
from tests.helpers.config import compose_config
from tests.helpers.dense import dense_heisenberg, dense_pauli, dense_phase, dense_rotation, on_states

TRIANGULAR3 = ["hilbert=triangular", "hilbert.L=3", "hilbert.total_sz=0.5", "hamiltonian=heisenberg",
               "sampler=metropolis_exchange"]


def test_three_sublattice_colouring_joins_different_sublattices_and_moves_with_translations():
    for lattice in (hb.triangular(3), hb.triangular(Lx=3, Ly=6), hb.triangular(Lx=2, Ly=4, pbc=False)):
        k = lattice.three_sublattice
        assert set(k.tolist()) == {0, 1, 2}
        assert all(k[i] != k[j] for i, j in lattice.bonds)
        assert all(k[i] == k[j] for i, j in lattice.next_bonds)  # the second shell stays on one sublattice
        for perm in lattice.space_group.rows("translations"):  # a translation adds one constant to every k
            assert len({int(d) for d in (k[perm] - k) % 3}) == 1
    for lattice in (hb.triangular(4), hb.triangular(Lx=3, Ly=4), hb.square(3), hb.kagome(Lx=1, Ly=3), hb.chain(6)):
        assert lattice.three_sublattice is None


@pytest.mark.parametrize("make,J2", [(lambda: hb.triangular(3), 0.0), (lambda: hb.triangular(3, pbc=False), 0.3)])
def test_three_sublattice_is_the_unitary_claimed(make, J2):
    """H' = U H U^dagger with U = prod_i exp(-i (2 pi k_i / 3) Z_i / 2) on the full space; one bond's terms
    are cos(d) (XX + YY) - sin(d) (XY - YX) + ZZ with d = theta_i - theta_j."""
    lattice = make()
    n = lattice.n_sites
    ham = hamiltonians.heisenberg(lattice, J=1.0, J2=J2, phase_prior="three_sublattice")
    assert not ham.is_real and ham.rotated is not None and ham.angles is not None
    U = dense_phase(ham, n)
    H = dense_heisenberg(lattice.bonds, lattice.next_bonds, n, 1.0, J2)
    got, idx = on_states(ham, lattice)
    np.testing.assert_allclose(got, (U @ H @ U.conj().T)[np.ix_(idx, idx)], atol=1e-12)
    i, j = (int(s) for s in lattice.bonds[0])
    d = 2 * math.pi * (int(lattice.three_sublattice[i]) - int(lattice.three_sublattice[j])) / 3
    bond = {ops: c for c, ops, sites in ham.terms if sites == (i, j)}
    expected = {"XX": math.cos(d), "YY": math.cos(d), "XY": -math.sin(d), "YX": math.sin(d), "ZZ": 1.0}
    assert bond.keys() == expected.keys()
    np.testing.assert_allclose([bond[k] for k in expected], list(expected.values()), atol=1e-12)


def test_marshall_is_the_unitary_claimed():
    lattice = hb.square(Lx=2, Ly=3, pbc=False)
    ham = hamiltonians.heisenberg(lattice, J=1.0, J2=0.4, phase_prior="marshall")
    assert ham.angles is None and ham.rotated == tuple(int(i) for i in np.nonzero(lattice.sublattice)[0])
    U = dense_phase(ham, 6)
    np.testing.assert_allclose(U, (-1j) ** len(ham.rotated) * dense_rotation(ham.rotated, 6), atol=1e-12)  # prod_B Z_i
    H = dense_heisenberg(lattice.bonds, lattice.next_bonds, 6, 1.0, 0.4)
    got, idx = on_states(ham, lattice)
    np.testing.assert_allclose(got, (U @ H @ U.conj().T)[np.ix_(idx, idx)], atol=1e-12)


def test_spectrum_unchanged_triangular_3x3_and_square_4x4():
    """The whole spectrum of the triangular 3 x 3 torus at Sz = 1/2 (9 sites: Sz = 0 does not exist), and the
    lowest levels of the square 4 x 4 J1-J2 model at Sz = 0, with and without the prior."""
    lattice = hb.triangular(3, total_sz=0.5)
    plain, rotated = (hamiltonians.heisenberg(lattice, phase_prior=p) for p in ("none", "three_sublattice"))
    np.testing.assert_allclose(np.linalg.eigvalsh(on_states(rotated, lattice)[0]),
                               np.linalg.eigvalsh(on_states(plain, lattice)[0]), atol=1e-10)
    square = hb.square(4, total_sz=0)
    plain, rotated = (hamiltonians.heisenberg(square, J2=0.5, phase_prior=p) for p in ("none", "marshall"))
    levels = [exact.lowest_levels(exact.operator(h, square), 3) for h in (plain, rotated)]
    np.testing.assert_allclose(levels[1], levels[0], atol=1e-9)


@pytest.mark.slow
def test_spectrum_unchanged_triangular_3x6():
    lattice = hb.triangular(Lx=3, Ly=6, total_sz=0)
    plain, rotated = (hamiltonians.heisenberg(lattice, phase_prior=p) for p in ("none", "three_sublattice"))
    levels = [exact.lowest_levels(exact.operator(h, lattice), 3) for h in (plain, rotated)]
    np.testing.assert_allclose(levels[1], levels[0], atol=1e-8)


def test_observables_are_rotated_like_h():
    """`rotate_like` gives U O U^dagger, so <U psi|U O U^dagger|U psi> is <psi|O|psi> in the user's basis."""
    lattice = hb.triangular(3)
    ham = hamiltonians.heisenberg(lattice, phase_prior="three_sublattice")
    terms = [(0.5, "XX", (0, 1)), (-0.3, "YZ", (1, 2)), (0.2, "Z", (3,)), (0.1, "XY", (4, 5)), (0.7, "X", (2,))]
    simulated = pauli.rotate_like(ham, pauli.pauli_sum(9, terms))
    U = dense_phase(ham, 9)
    got, idx = on_states(simulated, lattice)
    np.testing.assert_allclose(got, (U @ dense_pauli(terms, 9) @ U.conj().T)[np.ix_(idx, idx)], atol=1e-12)
    back = pauli.rotate(simulated, ham.rotated, [-a for a in ham.angles])
    assert back.rotated is None
    np.testing.assert_allclose(on_states(back, lattice)[0], on_states(pauli.pauli_sum(9, terms), lattice)[0],
                               atol=1e-12)


@pytest.mark.parametrize("make,prior,match", [
    (lambda: hb.triangular(4), "three_sublattice", "multiples of 3"),
    (lambda: hb.triangular(Lx=3, Ly=4), "three_sublattice", "multiples of 3"),
    (lambda: hb.square(3), "three_sublattice", "triangular"),
    (lambda: hb.kagome(Lx=1, Ly=3), "three_sublattice", "triangular"),
    (lambda: hb.triangular(3), "marshall", "bipartite"),
    (lambda: hb.kagome(Lx=1, Ly=3), "marshall", "bipartite"),
    (lambda: hb.chain(4), True, "must be null, none, marshall, three_sublattice"),
])
def test_refused_lattices_and_values(make, prior, match):
    with pytest.raises(ConfigError, match=match) as info:
        hamiltonians.heisenberg(make(), phase_prior=prior)
    assert info.value.key == "phase_prior"


def test_build_refuses_a_real_dtype_and_uses_the_group_the_rotated_h_keeps():
    """Three-sublattice H is complex (a real log psi is refused) and keeps the translations but not the point
    group's rotation by 60 degrees nor the spin flip: the spectrum by sector over the lattice's group refuses
    it, and the run carries the subgroup it keeps (`symmetry.keeping`), over which the full sum's orbits and
    the sectors are taken (tests/physics/test_kept_group.py checks them against dense sums)."""
    prior = [*TRIANGULAR3, "hamiltonian.phase_prior=three_sublattice"]
    with pytest.raises(ConfigError, match="complex") as info:
        build(compose_config([*prior, "dtype=float64"]))
    assert info.value.key == "hamiltonian.phase_prior"
    build(compose_config([*prior, "dtype=complex128"]))
    lattice = hb.triangular(3, total_sz=0.5)
    ham = hamiltonians.heisenberg(lattice, phase_prior="three_sublattice")
    assert pauli.not_invariant_under(ham, lattice.space_group.rows("translations")) is None
    assert pauli.not_invariant_under(ham, lattice.space_group.rows("lattice")) is not None
    assert not spectrum.commutes_with_flip(ham)
    with pytest.raises(ValueError, match="space-group element"):
        spectrum.spectrum(ham, lattice)
    summed = [*prior, "dtype=complex128", "model=rbm_symm", "model.group=translations"]
    build(compose_config([*summed, "sampler=full_sum_translations"]))
    assert build(compose_config([*summed, "sampler=full_sum_lattice"])).hilbert.space_group.perm_ExN.shape == (54, 9)
    cnn = [*prior, "dtype=complex128", "model=cnn", "model.channels=2"]
    assert build(compose_config([*cnn, "model.sector=auto"])).sector.name == "k=(0,0) A1"
    for sector in ("{momentum: [0, 0], irrep: A1}", "auto"):  # explicit, and auto with the exact solver off
        assert build(compose_config([*cnn, "exact=false", f"model.sector={sector}"])).sector.name == "k=(0,0) A1"


def test_rotated_h_keeps_the_elements_that_shift_every_sublattice_alike():
    """On the 3 x 3 torus the three-sublattice H commutes with a space-group element exactly where the element
    adds one constant to every k_i: every translation, the rotations by 2 pi / 3 and three mirrors (108 of 108
    elements checked one by one), not the rotation by pi / 3."""
    lattice = hb.triangular(3)
    group, k = lattice.space_group, lattice.three_sublattice
    ham = hamiltonians.heisenberg(lattice, phase_prior="three_sublattice")
    kept = set()
    for e, perm in enumerate(group.perm_ExN):
        invariant = pauli.not_invariant_under(ham, perm[None]) is None
        assert invariant == (len({int(d) for d in (k[perm] - k) % 3}) == 1)
        if invariant:
            kept.add(int(group.op_E[e]))
    angles = {p: round(math.degrees(math.atan2(R[1, 0], R[0, 0]))) % 360 for p, R in enumerate(group.ops)
              if np.linalg.det(R) > 0}
    assert {angles[p] for p in kept if p in angles} == {0, 120, 240}
    assert len(kept) == 6


def test_three_sublattice_moves_the_3x3_ground_state_to_zero_momentum():
    """At Sz = 1/2 a translation carries the phase exp(-i (2 pi / 3) S^z_total) of the uniform rotation it
    adds: the ground level -21 of the 3 x 3 torus lies away from k = 0 without the prior (the lowest
    translation-invariant level is -15) and at k = 0 with it."""
    lattice = hb.triangular(3, total_sz=0.5)
    translations = lattice.space_group.rows("translations")
    plain, rotated = (hamiltonians.heisenberg(lattice, phase_prior=p) for p in ("none", "three_sublattice"))
    np.testing.assert_allclose(spectrum.invariant_levels(plain, lattice, 1, translations), [-15.0], atol=1e-9)
    np.testing.assert_allclose(spectrum.invariant_levels(rotated, lattice, 1, translations), [-21.0], atol=1e-9)


def test_prior_state_overlap_with_the_exact_ground_level_3x3():
    """docs/physics.md's reference: the uniform state of the rotated basis has squared overlap 0.578571 with
    the (two-fold) ground level of the triangular 3 x 3 torus at Sz = 1/2 under three_sublattice, 0 without."""
    lattice = hb.triangular(3, total_sz=0.5)
    overlaps = []
    for prior in ("none", "three_sublattice"):
        w, v = np.linalg.eigh(on_states(hamiltonians.heisenberg(lattice, phase_prior=prior), lattice)[0])
        ground = v[:, np.abs(w - w[0]) < 1e-9]
        assert ground.shape[1] == 2
        overlaps.append(np.sum(np.abs(ground.conj().T @ np.ones(len(w))) ** 2) / len(w))
    np.testing.assert_allclose(overlaps, [0.0, 0.578571], atol=5e-7)


def test_marshall_rotated_h_keeps_the_square_lattice_space_group():
    lattice = hb.square(4, total_sz=0)
    ham = hamiltonians.heisenberg(lattice, J2=0.5, phase_prior="marshall")
    assert pauli.not_invariant_under(ham, lattice.space_group.rows("lattice")) is None


def test_sign_rule_is_read_as_phase_prior():
    """A stored run's `sign_rule` (true, false, null) compares equal to today's phase_prior (marshall, none,
    null), its stored overrides read in today's spelling, and the old key on a command line names the new."""
    today = fingerprint.of(compose_config(["experiment=j1j2_square"]))
    assert today["hamiltonian.phase_prior"] == "marshall"
    stored = {("hamiltonian.sign_rule" if k == "hamiltonian.phase_prior" else k): v for k, v in today.items()}
    stored["hamiltonian.sign_rule"] = True
    assert fingerprint.first_difference(stored, today) is None
    assert fingerprint.digest(stored) == fingerprint.digest(today)
    stored["hamiltonian.sign_rule"] = False
    assert fingerprint.first_difference(stored, today) == ("hamiltonian.phase_prior", "none", "marshall")
    default = fingerprint.of(compose_config(["hamiltonian=heisenberg"]))
    old = {("hamiltonian.sign_rule" if k == "hamiltonian.phase_prior" else k): v for k, v in default.items()}
    assert fingerprint.first_difference(old, default) is None
    assert hamiltonians.upgraded_overrides(["hamiltonian.sign_rule=true", "hamiltonian.sign_rule=false", "seed=3"]) == [
        "hamiltonian.phase_prior=marshall", "hamiltonian.phase_prior=none", "seed=3"]
    with pytest.raises(ConfigError, match="hamiltonian.phase_prior") as info:
        compose.check_overrides(["hamiltonian=heisenberg", "hamiltonian.sign_rule=true"])
    assert info.value.key == "hamiltonian.sign_rule"
