"""Matrix-free exact diagonalisation against dense Pauli matrices and closed forms."""

import numpy as np
import pytest

from runner import exact, operators
from runner import hilbert as hb
from tests.dense import basis_index, dense_heisenberg, dense_ising


@pytest.mark.parametrize(
    "make",
    [
        lambda: (hb.chain(7), lambda h: operators.ising(h, 0.7, 1.3), lambda h: dense_ising(h.bonds, h.n_sites, 0.7, 1.3)),
        lambda: (hb.square(Lx=2, Ly=4, pbc=False), lambda h: operators.ising(h, 1.0, 3.0),
                 lambda h: dense_ising(h.bonds, h.n_sites, 1.0, 3.0)),
        lambda: (hb.chain(8), lambda h: operators.heisenberg(h, 1.0, 0.4, False),
                 lambda h: dense_heisenberg(h.bonds, h.next_bonds, h.n_sites, 1.0, 0.4)),
        lambda: (hb.chain(8, total_sz=0), lambda h: operators.heisenberg(h, 1.0, 0.4, True),
                 lambda h: dense_heisenberg(h.bonds, h.next_bonds, h.n_sites, 1.0, 0.4)),
        lambda: (hb.chain(9, total_sz=0.5), lambda h: operators.heisenberg(h, 1.0, 0.0, False),
                 lambda h: dense_heisenberg(h.bonds, [], h.n_sites, 1.0, 0.0)),
        lambda: (hb.square(Lx=2, Ly=3, pbc=False, total_sz=1), lambda h: operators.heisenberg(h, 1.0, 0.3, None),
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
    ham = operators.heisenberg(lattice, 1.0, 0.5, True)
    states = hb.all_states(lattice)
    v = np.random.default_rng(1).standard_normal(2**9)
    np.testing.assert_allclose(exact._full_space_matvec(ham, 9)(v), operators.to_sparse(ham, states) @ v, atol=1e-12)


def test_tfim_chain_closed_form():
    """Periodic TFIM at h=J=1 (even L): E0 = -sum_k 2|cos(k/2)|, k = (2m+1) pi / L."""
    L = 14
    k = (2 * np.arange(L) + 1) * np.pi / L
    closed = -np.sum(2 * np.abs(np.cos(k / 2)))
    np.testing.assert_allclose(exact.ground_energy(operators.ising(hb.chain(L), 1.0, 1.0), hb.chain(L)), closed, rtol=1e-10)


def test_auto_threshold():
    assert exact.wants_exact("auto", hb.chain(20))
    assert not exact.wants_exact("auto", hb.chain(21))
    assert exact.wants_exact("auto", hb.chain(24, total_sz=0)) is False
    assert exact.wants_exact(True, hb.chain(30)) and not exact.wants_exact(False, hb.chain(4))


@pytest.mark.parametrize(
    "lattice,make_ham",
    [
        (hb.chain(8), lambda h: operators.ising(h, 1.0, 0.9)),
        (hb.chain(8, total_sz=0), lambda h: operators.heisenberg(h, 1.0, 0.2, None)),
    ],
)
def test_energy_of_a_state_matches_dense(lattice, make_ham):
    """<psi|H|psi>/<psi|psi> of a random complex state against the dense Pauli matrices, and
    the ground energy for the ground state."""
    ham = make_ham(lattice)
    states = hb.all_states(lattice)
    H = operators.to_sparse(ham, states).toarray()
    re, im = np.random.default_rng(3).standard_normal((2, len(states)))
    psi = re + 1j * im
    np.testing.assert_allclose(exact.energy_of(ham, lattice, psi), (psi.conj() @ H @ psi).real / np.vdot(psi, psi).real,
                               rtol=1e-12)
    w, v = np.linalg.eigh(H)
    np.testing.assert_allclose(exact.energy_of(ham, lattice, v[:, 0]), w[0], rtol=1e-12)
