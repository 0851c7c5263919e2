"""Exact dynamics against dense matrix exponentials, and the free-fermion Ising quench against
the matrix-free evolution."""

import numpy as np
import pytest
import scipy.linalg

from runner.physics import dynamics, exact, hamiltonians, pauli
from runner.physics import hilbert as hb
from tests.helpers.dense import basis_index, dense_pauli

TIMES = np.array([0.0, 0.3, 0.7, 0.7, 1.5, 3.0])


def _random_state(d, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(d) + 1j * rng.standard_normal(d)


def _cases():
    full = hb.chain(4)
    ising = hamiltonians.ising(full, J=0.8, h=1.3)
    sector = hb.chain(6, total_sz=0)
    # XXZ with a Dzyaloshinskii-Moriya term (X Y - Y X conserves Sz; its elements are complex).
    terms = [{"coeff": 1.0, "ops": "XX", "on": "bonds"}, {"coeff": 1.0, "ops": "YY", "on": "bonds"},
             {"coeff": 0.6, "ops": "ZZ", "on": "bonds"}, {"coeff": 0.4, "ops": "XY", "on": "bonds"},
             {"coeff": -0.4, "ops": "YX", "on": "bonds"}, {"coeff": -0.3, "ops": "Z", "on": [[0]]}]
    return {"ising_full_space": (full, ising), "dm_xxz_sector": (sector, hamiltonians.pauli(sector, terms))}


@pytest.mark.parametrize("case", ["ising_full_space", "dm_xxz_sector"])
def test_evolve_matches_dense_expm(case):
    lattice, ham = _cases()[case]
    assert case == "ising_full_space" or not ham.is_real
    idx = basis_index(hb.all_states(lattice))
    H = dense_pauli(ham.terms, lattice.n_sites)[np.ix_(idx, idx)]
    psi0 = _random_state(lattice.n_states)
    psi_TxD = dynamics.evolve(ham, lattice, psi0, TIMES)
    for t, psi in zip(TIMES, psi_TxD):
        np.testing.assert_allclose(psi, scipy.linalg.expm(-1j * H * t) @ psi0, atol=1e-11)

    Z0 = pauli.pauli_sum(lattice.n_sites, [(1.0, "Z", (0,))])
    measured = {name: exact.expectation(op, lattice, psi_TxD) for name, op in (("z0", Z0), ("energy", ham))}
    Z0_dense = dense_pauli(Z0.terms, lattice.n_sites)[np.ix_(idx, idx)]
    for name, M in (("z0", Z0_dense), ("energy", H)):
        expected = [np.vdot(p, M @ p).real / np.vdot(p, p).real for p in psi_TxD]
        np.testing.assert_allclose(measured[name], expected, atol=1e-12)
    assert np.ptp(measured["energy"]) < 1e-10  # conserved


def test_ground_state_is_the_lowest_eigenvector():
    lattice = hb.chain(8)
    ham = hamiltonians.ising(lattice, J=1.0, h=1.7)
    psi = dynamics.ground_state(ham, lattice)
    H = dense_pauli(ham.terms, 8)[np.ix_(*(basis_index(hb.all_states(lattice)),) * 2)]
    np.testing.assert_allclose(np.vdot(psi, H @ psi).real, np.linalg.eigvalsh(H)[0], rtol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(H @ psi - np.vdot(psi, H @ psi) * psi), 0, atol=1e-6)


@pytest.mark.parametrize("n_sites", [8, 10, 12])
@pytest.mark.parametrize("h0,h1", [(3.0, 0.5), (0.6, 1.4), (1.0, 1.0)])
def test_free_fermion_ising_quench_matches_exact_evolution(n_sites, h0, h1):
    """<X>(t) after the quench h0 -> h1 (J = 1.2), free fermions against the ground state at h0
    evolved exactly; h0 = h1 gives the ground state's constant value."""
    J = 1.2
    lattice = hb.chain(n_sites)
    times = np.linspace(0.0, 3.0, 13)
    psi0 = dynamics.ground_state(hamiltonians.ising(lattice, J=J, h=h0), lattice)
    psi_TxD = dynamics.evolve(hamiltonians.ising(lattice, J=J, h=h1), lattice, psi0, times)
    x = pauli.pauli_sum(n_sites, [(1.0 / n_sites, "X", (i,)) for i in range(n_sites)])
    krylov = exact.expectation(x, lattice, psi_TxD)
    fermions = dynamics.ising_quench_magnetisation(n_sites, h0, h1, times, J=J)
    np.testing.assert_allclose(fermions, krylov, atol=1e-8)
    if h0 == h1:
        assert np.ptp(fermions) < 1e-12
    else:
        assert np.ptp(fermions) > 0.05  # the test sees dynamics


def test_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="even"):
        dynamics.ising_quench_magnetisation(7, 1.0, 2.0, [0.0])
    with pytest.raises(ValueError, match="increasing"):
        dynamics.evolve(hamiltonians.ising(hb.chain(4)), hb.chain(4), np.ones(16), [1.0, 0.5])


@pytest.mark.parametrize("h", [0.5, 1.7])
def test_free_fermion_ground_energy_and_quench_energy(h):
    """The free-fermion ground energy at h against dense diagonalisation (J = 0.9, N = 8), and the
    conserved <H(h1)> from that ground state against the state's dense expectation value."""
    n, J, h1 = 8, 0.9, 1.3
    idx = basis_index(hb.all_states(hb.chain(n)))
    H0 = dense_pauli(hamiltonians.ising(hb.chain(n), J=J, h=h).terms, n)[np.ix_(idx, idx)]
    H1 = dense_pauli(hamiltonians.ising(hb.chain(n), J=J, h=h1).terms, n)[np.ix_(idx, idx)]
    energies, vectors = np.linalg.eigh(H0)
    np.testing.assert_allclose(dynamics.ising_ground_energy(n, h, J=J), energies[0], rtol=1e-12)
    psi = vectors[:, 0]
    np.testing.assert_allclose(dynamics.ising_quench_energy(n, h, h1, J=J), psi @ H1 @ psi, rtol=1e-12)


def test_ising_chain_and_uniform_x_are_recognised_exactly():
    """(J, h) of a periodic Ising chain and c of c sum X_i; anything else (an open chain, a square
    lattice, an odd chain, a missing or different term, a rotated basis) is None."""
    assert dynamics.ising_chain_couplings(hamiltonians.ising(hb.chain(8), J=0.7, h=1.3)) == (0.7, 1.3)
    others = [hamiltonians.ising(hb.chain(8, pbc=False)), hamiltonians.ising(hb.square(4)),
              hamiltonians.ising(hb.chain(7)), hamiltonians.ising(hb.chain(8), h=0.0),
              hamiltonians.xxz(hb.chain(8)),
              pauli.pauli_sum(8, [*hamiltonians.ising(hb.chain(8)).terms, (0.1, "Z", (0,))]),
              pauli.rotate(hamiltonians.ising(hb.chain(8)), (0, 2, 4, 6))]
    assert all(dynamics.ising_chain_couplings(op) is None for op in others)
    x = pauli.pauli_sum(6, [(0.25, "X", (i,)) for i in range(6)])
    assert dynamics.uniform_x_coefficient(x) == 0.25
    assert dynamics.uniform_x_coefficient(pauli.pauli_sum(6, [(0.25, "X", (i,)) for i in range(5)])) is None
    assert dynamics.uniform_x_coefficient(pauli.pauli_sum(6, [(0.25, "Z", (i,)) for i in range(6)])) is None
