"""Matrix-free exact diagonalisation against dense Pauli matrices and closed forms."""

import numpy as np
import pytest

from runner.physics import exact, hamiltonians, pauli
from runner.physics import hilbert as hb
from tests.helpers.dense import basis_index, dense_heisenberg, dense_ising


@pytest.mark.parametrize(
    "make",
    [
        lambda: (hb.chain(7), lambda h: hamiltonians.ising(h, 0.7, 1.3), lambda h: dense_ising(h.bonds, h.n_sites, 0.7, 1.3)),
        lambda: (hb.square(Lx=2, Ly=4, pbc=False), lambda h: hamiltonians.ising(h, 1.0, 3.0),
                 lambda h: dense_ising(h.bonds, h.n_sites, 1.0, 3.0)),
        lambda: (hb.chain(8), lambda h: hamiltonians.heisenberg(h, 1.0, 0.4, "none"),
                 lambda h: dense_heisenberg(h.bonds, h.next_bonds, h.n_sites, 1.0, 0.4)),
        lambda: (hb.chain(8, total_sz=0), lambda h: hamiltonians.heisenberg(h, 1.0, 0.4, "marshall"),
                 lambda h: dense_heisenberg(h.bonds, h.next_bonds, h.n_sites, 1.0, 0.4)),
        lambda: (hb.chain(9, total_sz=0.5), lambda h: hamiltonians.heisenberg(h, 1.0, 0.0, "none"),
                 lambda h: dense_heisenberg(h.bonds, [], h.n_sites, 1.0, 0.0)),
        lambda: (hb.square(Lx=2, Ly=3, pbc=False, total_sz=1), lambda h: hamiltonians.heisenberg(h, 1.0, 0.3, None),
                 lambda h: dense_heisenberg(h.bonds, h.next_bonds, h.n_sites, 1.0, 0.3)),
    ],
)
def test_ground_energy_matches_dense(make):
    lattice, make_ham, make_dense = make()
    ham = make_ham(lattice)
    H = make_dense(lattice)
    idx = basis_index(hb.all_states(lattice))
    expected = np.linalg.eigvalsh(H[np.ix_(idx, idx)])[0]
    np.testing.assert_allclose(exact.ground_energy(ham, lattice), expected, rtol=1e-10)


def test_full_space_matvec_equals_sparse_matrix():
    lattice = hb.chain(9, pbc=False)
    ham = hamiltonians.heisenberg(lattice, 1.0, 0.5, "marshall")
    states = hb.all_states(lattice)
    v = np.random.default_rng(1).standard_normal(2**9)
    np.testing.assert_allclose(exact._full_space_matvec(ham, 9)(v), pauli.to_sparse(ham, states) @ v, atol=1e-12)


def test_tfim_chain_closed_form():
    """Periodic TFIM at h=J=1 (even L): E0 = -sum_k 2|cos(k/2)|, k = (2m+1) pi / L."""
    L = 14
    k = (2 * np.arange(L) + 1) * np.pi / L
    closed = -np.sum(2 * np.abs(np.cos(k / 2)))
    np.testing.assert_allclose(exact.ground_energy(hamiltonians.ising(hb.chain(L), 1.0, 1.0), hb.chain(L)), closed, rtol=1e-10)


def test_auto_threshold():
    assert exact.wants_exact("auto", hb.chain(20))
    assert not exact.wants_exact("auto", hb.chain(21))
    assert exact.wants_exact("auto", hb.chain(24, total_sz=0)) is False
    assert exact.wants_exact(True, hb.chain(30)) and not exact.wants_exact(False, hb.chain(4))


@pytest.mark.parametrize(
    "lattice,make_ham",
    [
        (hb.chain(8), lambda h: hamiltonians.ising(h, 1.0, 0.9)),
        (hb.chain(8, total_sz=0), lambda h: hamiltonians.heisenberg(h, 1.0, 0.2, None)),
    ],
)
def test_energy_of_a_state_matches_dense(lattice, make_ham):
    """<psi|H|psi>/<psi|psi> of a random complex state against the dense Pauli matrices, and
    the ground energy for the ground state."""
    ham = make_ham(lattice)
    states = hb.all_states(lattice)
    H = pauli.to_sparse(ham, states).toarray()
    re, im = np.random.default_rng(3).standard_normal((2, len(states)))
    psi = re + 1j * im
    np.testing.assert_allclose(exact.energy_of(ham, lattice, psi), (psi.conj() @ H @ psi).real / np.vdot(psi, psi).real,
                               rtol=1e-12)
    w, v = np.linalg.eigh(H)
    np.testing.assert_allclose(exact.energy_of(ham, lattice, v[:, 0]), w[0], rtol=1e-12)


@pytest.mark.parametrize("kind", ["ising", "heisenberg", "xxz", "pauli"])
@pytest.mark.parametrize("lattice_name", ["triangular3_pbc", "honeycomb2_pbc", "kagome1x3_pbc", "chain5_obc", "graph5"])
@pytest.mark.slow
def test_lanczos_matches_eigvalsh_for_every_lattice_and_hamiltonian(lattice_name, kind):
    from tests.helpers.lattices import SMALL_LATTICES, hamiltonian_and_dense

    lattice = SMALL_LATTICES[lattice_name]()
    ham, H = hamiltonian_and_dense(kind, lattice)
    np.testing.assert_allclose(exact.ground_energy(ham, lattice), np.linalg.eigvalsh(H)[0], rtol=1e-10, atol=1e-10)
    v = np.random.default_rng(2).standard_normal(2**lattice.n_sites) + 1j * np.random.default_rng(3).standard_normal(2**lattice.n_sites)
    idx = basis_index(hb.all_states(lattice))
    np.testing.assert_allclose(exact.matvec_of(ham, lattice)(v), H[np.ix_(idx, idx)] @ v, atol=1e-10)


@pytest.mark.parametrize("make", [
    lambda h: hamiltonians.xxz(h, J=0.9, Delta=0.6, hz=0.3),
    lambda h: hamiltonians.heisenberg(h, J=1.0, J2=0.0, phase_prior="none"),
    lambda h: hamiltonians.pauli(h, [{"coeff": 0.7, "ops": "XY", "on": "bonds"}, {"coeff": -0.7, "ops": "YX", "on": "bonds"},
                                  {"coeff": 0.4, "ops": "ZZ", "on": "bonds"}]),  # Dzyaloshinskii-Moriya: complex H
])
def test_lanczos_in_sz_sectors(make):
    lattice = hb.triangular(3, total_sz=0.5)
    ham = make(lattice)
    H = pauli.to_sparse(ham, hb.all_states(lattice)).toarray()
    assert lattice.n_states == 126 and np.allclose(H, H.conj().T)
    np.testing.assert_allclose(exact.ground_energy(ham, lattice), np.linalg.eigvalsh(H)[0], rtol=1e-10)
    psi = np.random.default_rng(0).standard_normal(126) * (1 + 0.5j)
    np.testing.assert_allclose(exact.energy_of(ham, lattice, psi), (psi.conj() @ H @ psi).real / np.vdot(psi, psi).real,
                               rtol=1e-12)


def test_required_bytes_and_build_refuses_exact_true_beyond_memory():
    from runner.config.build import build
    from runner.errors import ConfigError
    from tests.helpers.config import compose_config

    assert exact.required_bytes(hb.chain(21)) == 2 * exact.required_bytes(hb.chain(20))
    assert exact.required_bytes(hb.chain(20, total_sz=0)) > 2**20 * 16  # the code scan of the full space
    with pytest.raises(ConfigError) as info:
        build(compose_config(["hilbert.L=40", "exact=true"]))
    assert info.value.key == "exact" and "GiB" in info.value.message
    build(compose_config(["hilbert.L=40", "exact=auto"]))
    build(compose_config(["hilbert.L=12", "exact=true"]))


def dense_observables(lattice, H_full):
    """The standard set and S(q) on every momentum in the ground vector of H_full restricted to
    the lattice's space, from Kronecker products (independent of runner.physics)."""
    from tests.helpers.dense import X, Z, site_op

    n, idx = lattice.n_sites, basis_index(hb.all_states(lattice))
    energies, vectors = np.linalg.eigh(H_full[np.ix_(idx, idx)])
    assert energies[1] - energies[0] > 1e-6  # a unique ground state: its values are defined
    psi = np.zeros(2**n, complex)
    psi[idx] = vectors[:, 0]
    expect = lambda op: float(np.real(np.vdot(psi, op @ psi)))  # noqa: E731 (P O P: psi is in the space)
    Zs, Xs = [site_op(Z, i, n) for i in range(n)], [site_op(X, i, n) for i in range(n)]
    bonds = [tuple(b) for b in lattice.bonds]
    values = {
        "magnetization_x": expect(sum(Xs)) / n,
        "magnetization_z": expect(sum(Zs)) / n,
        "mz2": expect(sum(Zs) @ sum(Zs)) / n**2,
        "zz_nn": np.mean([expect(Zs[i] @ Zs[j]) for i, j in bonds]),
        "xx_nn": np.mean([expect(Xs[i] @ Xs[j]) for i, j in bonds]),
    }
    sq = []
    for q in np.asarray(lattice.momenta, float).reshape(-1, np.asarray(lattice.positions).shape[1]):
        phase = np.exp(1j * np.asarray(lattice.positions, float) @ q)
        fourier = sum(phase[i] * Zs[i] for i in range(n))
        sq.append(expect(fourier.conj().T @ fourier) / n)
    values["structure_factor_zz"] = max(sq)
    return values, sq, [[expect(Zs[i] @ Zs[j]) for j in range(n)] for i in range(n)]


@pytest.mark.parametrize(
    "lattice,make_ham,make_dense",
    [
        (hb.chain(8, total_sz=0), lambda h: hamiltonians.heisenberg(h, 1.0, 0.3, "marshall"),
         lambda h: dense_heisenberg(h.bonds, h.next_bonds, h.n_sites, 1.0, 0.3)),
        (hb.chain(8), lambda h: hamiltonians.ising(h, 1.0, 0.8), lambda h: dense_ising(h.bonds, h.n_sites, 1.0, 0.8)),
        (hb.chain(6, total_sz=0), lambda h: hamiltonians.heisenberg(h, 1.0, 0.0, None),  # 20 states
         lambda h: dense_heisenberg(h.bonds, [], h.n_sites, 1.0, 0.0)),
        (hb.square(Lx=2, Ly=3, pbc=False), lambda h: hamiltonians.ising(h, 1.0, 2.0),
         lambda h: dense_ising(h.bonds, h.n_sites, 1.0, 2.0)),
    ],
)
def test_exact_observables_of_the_ground_vector_match_dense_diagonalisation(lattice, make_ham, make_dense):
    from runner.physics import observables

    ham = make_ham(lattice)  # the sign rule rotates the simulated basis; observables are the user's
    energy, psi = exact.ground_state(ham, lattice)
    assert energy == exact.ground_energy(ham, lattice)  # the energy of the same run, bit for bit
    summary, correlations = observables.exact_values(observables.spin(lattice, ham), lattice, psi)
    values, sq, zz = dense_observables(lattice, make_dense(lattice))
    assert set(summary["exact_observables"]) == set(values)
    for name, value in values.items():
        assert summary["exact_observables"][name] == pytest.approx(value, abs=1e-8), name
    np.testing.assert_allclose(correlations["exact_structure_factor"], sq, atol=1e-8)
    np.testing.assert_allclose(correlations["exact_zz"], zz, atol=1e-8)


def test_ritz_vector_is_an_eigenvector_to_the_vector_tolerance():
    lattice = hb.square(L=4, total_sz=0)
    ham = hamiltonians.heisenberg(lattice, 1.0, 0.0, "marshall")
    energy, psi = exact.ground_state(ham, lattice)
    residual = np.linalg.norm(exact.matvec_of(ham, lattice)(psi) - energy * psi)
    assert np.linalg.norm(psi) == pytest.approx(1.0) and residual < 2 * exact.VECTOR_TOL * abs(energy)


@pytest.mark.parametrize("make", [
    lambda: (hb.chain(6), lambda h: hamiltonians.ising(h, 1.0, 0.5)),  # dense (64 states), nearly degenerate pair
    lambda: (hb.chain(10), lambda h: hamiltonians.ising(h, 1.0, 1.0)),  # ARPACK (1024 states)
    lambda: (hb.chain(12, total_sz=0), lambda h: hamiltonians.heisenberg(h, 1.0, 0.0, "none")),  # ARPACK, Sz sector
    lambda: (hb.triangular(3, total_sz=0.5), lambda h: hamiltonians.pauli(h, [  # complex H, dense
        {"coeff": 0.7, "ops": "XY", "on": "bonds"}, {"coeff": -0.7, "ops": "YX", "on": "bonds"},
        {"coeff": 0.4, "ops": "ZZ", "on": "bonds"}])),
])
def test_lowest_levels_match_eigvalsh(make):
    """The K lowest levels, degenerate ones repeated, by dense or ARPACK, equal dense eigvalsh."""
    lattice, make_ham = make()
    ham = make_ham(lattice)
    H = pauli.to_sparse(ham, hb.all_states(lattice)).toarray()
    np.testing.assert_allclose(exact.lowest_levels(exact.operator(ham, lattice), 5), np.linalg.eigvalsh(H)[:5],
                               rtol=1e-10, atol=1e-10)
