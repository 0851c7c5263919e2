"""Natural excited states: the K-state determinant, the copies' space and Hamiltonian, and the
energy matrix, against dense diagonalisation."""

from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.determinant import Determinant
from runner.core import excited, local_energy
from runner.errors import ConfigError
from runner.physics import hamiltonians, hilbert as hb, pauli, replicas


class Table(nn.Module):
    """log psi(s) read from a table of 2^N complex values (site 0 the most significant bit)."""

    n_sites: int
    holomorphic = True

    @nn.compact
    def __call__(self, sigma_xN):
        table = self.param("table", lambda key, shape: jax.random.normal(key, shape) * (1 + 0.5j), (2**self.n_sites,))
        bits = (sigma_xN > 0).astype(jnp.int32)
        return table[bits @ (1 << jnp.arange(self.n_sites - 1, -1, -1))]


def _system(n=4, h=0.7):
    space = hb.chain(n)
    ham = hamiltonians.ising(space, h=h)
    states = hb.all_states(space)
    dense = pauli.to_sparse(ham, states).toarray()
    return space, ham, states, dense


def _determinant_of(vectors_KxD, n):
    """A Determinant of Tables whose K states are exactly `vectors` (complex logs)."""
    model = Determinant(Table(n), n_states=len(vectors_KxD))
    params = {"base": {"table": jnp.asarray(np.log(vectors_KxD.astype(complex)))}}
    return model, params


def _each(model):
    return lambda p, s: model.apply({"params": p}, s, method=model.each)


class Mixed(NamedTuple):
    """K states psi_i = sum_k C_ik phi_k over the K lowest eigenstates of `_system(n)`, as a
    Determinant, and its local matrices at draws of K distinct configurations."""

    ham: object
    states: np.ndarray  # [2^n, n]
    dense: np.ndarray  # [2^n, 2^n]
    energies: np.ndarray  # [2^n] every level, ascending
    phi: np.ndarray  # [2^n, 2^n] the eigenvectors as columns
    c: np.ndarray  # [K, K]
    model: Determinant
    params: dict
    sigma: jax.Array  # [2, draws / 2, K n] int8
    m: jax.Array  # [2, draws / 2, K, K]
    rng: np.random.Generator  # after C's and the configurations' draws


def _mixed_eigenstates(seed: int, n: int, K: int, draws: int = 8) -> Mixed:
    _, ham, states, dense = _system(n)
    energies, phi = np.linalg.eigh(dense)
    rng = np.random.default_rng(seed)
    c = rng.normal(size=(K, K)) + 1j * rng.normal(size=(K, K))
    model, params = _determinant_of(c @ phi[:, :K].T, n)
    # configurations no symmetry of the chain maps onto each other (elsewhere det Psi may vanish)
    codes = np.array([rng.choice([0, 1, 3, 5, 7, 15], size=K, replace=False) for _ in range(draws)])
    sigma = jnp.asarray(states[codes].reshape(2, draws // 2, -1), jnp.int8)
    m = excited.local_matrices(ham, _each(model), params, sigma, K)
    return Mixed(ham, states, dense, energies, phi, c, model, params, sigma, m, rng)


def test_the_determinant_is_log_det_of_the_states_and_antisymmetric():
    n, K = 4, 3
    model = Determinant(Table(n), n_states=K)
    x = jnp.asarray(hb.all_states(hb.chain(n))[[1, 6, 11]].reshape(-1), jnp.int8)
    params = model.init(jax.random.PRNGKey(0), x)["params"]
    assert params["base"]["table"].shape == (K, 2**n)  # each state its own parameters
    table = np.asarray(params["base"]["table"])
    codes = [1, 6, 11]
    direct = np.linalg.det(np.exp(table[:, codes]))
    assert np.allclose(np.exp(complex(model.apply({"params": params}, x))), direct, rtol=1e-12)
    swapped = x.reshape(K, n)[jnp.array([1, 0, 2])].reshape(-1)
    assert np.allclose(np.exp(complex(model.apply({"params": params}, swapped))), -direct, rtol=1e-12)


def test_copies_hamiltonian_is_the_kronecker_sum():
    space, ham, _, dense = _system(n=3)
    both = replicas.hamiltonian(ham, 2)
    big = pauli.to_sparse(both, hb.all_states(hb.chain(6, pbc=False)._replace(n_sites=6))).toarray()
    eye = np.eye(len(dense))
    assert np.allclose(big, np.kron(dense, eye) + np.kron(eye, dense), atol=1e-12)
    two = replicas.hilbert(space, 2)
    assert two.n_sites == 6 and len(two.bonds) == 2 * len(space.bonds)
    with pytest.raises(ConfigError, match="copies"):
        replicas.hilbert(two, 2)


def test_copies_keep_total_sz_in_each_copy():
    """A fixed total_sz holds in each copy: the basis, its size and the samplers' random starts."""
    from runner.core.sampler import random_state

    two = replicas.hilbert(hb.chain(4, total_sz=0), 3)
    states = hb.all_states(two)
    assert two.n_states == len(states) == 6**3
    assert np.all(states.reshape(len(states), 3, 4).sum(-1) == 0)
    starts = jax.vmap(lambda k: random_state(two, k))(jax.random.split(jax.random.PRNGKey(0), 64))
    per_copy = np.asarray(starts).reshape(64, 3, 4)
    assert np.all(per_copy.sum(-1) == 0) and len({tuple(x) for x in per_copy.reshape(64, -1)}) > 32


def test_the_local_matrix_is_the_dense_one():
    """M(x) = (H Psi) Psi^-1 from connected elements equals the one from the dense H, and its
    trace is the determinant's local energy under the copies' Hamiltonian."""
    n, K = 4, 3
    space, ham, states, dense = _system(n)
    rng = np.random.default_rng(1)
    vectors = rng.normal(size=(K, len(states))) + 1j * rng.normal(size=(K, len(states)))
    model, params = _determinant_of(vectors, n)
    h_vectors = vectors @ dense.T  # (H psi_i)(s) = sum_s' H_ss' psi_i(s')
    copies = replicas.hamiltonian(ham, K)
    for codes in ([0, 5, 9], [3, 12, 7], [15, 1, 2]):
        x = jnp.asarray(states[codes], jnp.int8)
        m = excited.local_matrix(ham, _each(model), params, x)
        expected = h_vectors[:, codes] @ np.linalg.inv(vectors[:, codes])
        assert np.allclose(m, expected, rtol=1e-10, atol=1e-10)
        logpsi = lambda p, s: model.apply({"params": p}, s)  # noqa: E731
        e_loc = local_energy.local_energy(copies, logpsi, params, x.reshape(-1))
        assert np.isclose(np.trace(np.asarray(m)), complex(e_loc), rtol=1e-10)


def test_states_spanning_eigenstates_give_their_energies_at_every_sample():
    """psi_i = sum_k C_ik phi_k over the K lowest eigenstates: M(x) = C diag(E) C^-1 at every x
    (zero variance), so the energies and gaps are exact from any samples."""
    K = 3
    mix = _mixed_eigenstates(2, 4, K, draws=10)
    m, energies = mix.m, mix.energies
    expected = mix.c @ np.diag(energies[:K]) @ np.linalg.inv(mix.c)
    assert np.allclose(m, np.broadcast_to(expected, m.shape), atol=1e-9)
    found = excited.levels(m)
    assert np.allclose(found.energies, energies[:K], atol=1e-9)
    assert np.allclose(found.gaps, energies[1:K] - energies[0], atol=1e-9)
    assert np.all(found.energy_errors < 1e-9) and np.all(found.gap_errors < 1e-9)


def test_state_variances_vanish_for_eigenstates_and_are_the_diagonal_variances_otherwise():
    """Per-state variances: zero (1e-18) where the states span eigenstates (local matrices of the
    model, not constructed ones); otherwise the weighted variance of diag(C^-1 M(x) C) with C the
    eigenvectors of the mean, ordered like the ascending levels (checked against a direct loop)."""
    n, K = 4, 3
    mix = _mixed_eigenstates(5, n, K)
    assert np.all(excited.state_variances(mix.m) < 1e-18)
    rng, D = mix.rng, len(mix.states)
    model, params = _determinant_of(rng.normal(size=(K, D)) + 1j * rng.normal(size=(K, D)), n)
    m = np.asarray(excited.local_matrices(mix.ham, _each(model), params, mix.sigma, K))
    w = rng.uniform(0.5, 2.0, size=(2, 4))
    flat, wf = m.reshape(-1, K, K), (w / w.sum()).reshape(-1)
    values, c = np.linalg.eig(sum(wi * mi for wi, mi in zip(wf, flat)))
    c = c[:, np.argsort(values.real)]
    diag = np.array([np.diag(np.linalg.inv(c) @ mi @ c) for mi in flat])
    expected = [sum(wi * abs(d - wf @ diag[:, k]) ** 2 for wi, d in zip(wf, diag[:, k])) for k in range(K)]
    np.testing.assert_allclose(excited.state_variances(m, w), expected, rtol=1e-10)
    assert np.all(np.asarray(expected) > 1e-3)


def test_a_full_sum_of_the_local_matrix_is_its_dense_mean():
    """Over every product configuration weighted by |det Psi|^2, the mean local matrix equals the
    dense sum; jackknife errors are zero for a full sum and positive from chains that differ."""
    n, K = 3, 2
    space, ham, states, dense = _system(n)
    rng = np.random.default_rng(3)
    vectors = rng.normal(size=(K, len(states))) + 1j * rng.normal(size=(K, len(states)))
    model, params = _determinant_of(vectors, n)
    pairs = np.array([(a, b) for a in range(len(states)) for b in range(len(states)) if a != b])
    x = jnp.asarray(states[pairs].reshape(1, len(pairs), -1), jnp.int8)
    m = np.asarray(excited.local_matrices(ham, _each(model), params, x, K))
    psi = vectors[:, pairs]  # [K, P, K]: psi_i(x_j) of each pair
    w = np.abs(np.linalg.det(np.moveaxis(psi, 0, 1))) ** 2
    hpsi = (vectors @ dense.T)[:, pairs]
    dense_m = np.einsum("ipj,pjk->pik", hpsi, np.linalg.inv(np.moveaxis(psi, 0, 1)))
    assert np.allclose(m[0], dense_m, atol=1e-10)
    full = excited.levels(m, w[None, :], exact=True)
    mean = np.einsum("p,pik->ik", w, dense_m) / w.sum()
    assert np.allclose(full.energies, np.sort(np.linalg.eigvals(mean).real), atol=1e-10)
    assert np.all(full.energy_errors == 0)
    halves = excited.levels(m.reshape(2, -1, K, K), w.reshape(2, -1))
    assert np.all(halves.energy_errors > 0)


def test_state_expectations_are_those_of_the_ritz_states_in_the_span():
    """Over every product configuration weighted by |det Psi|^2, each state's <O> is that of the
    Rayleigh-Ritz eigenvector of H in the span of K arbitrary states (dense generalised eigenproblem),
    for an operator that does not commute with H; jackknife errors are positive from differing chains."""
    n, K = 3, 2
    space, ham, states, dense = _system(n)
    op = pauli.pauli_sum(n, [(1.0 / n, "X", (i,)) for i in range(n)] + [(0.3, "ZZ", (0, 1))])
    dense_op = pauli.to_sparse(op, states).toarray()
    rng = np.random.default_rng(7)
    vectors = rng.normal(size=(K, len(states))) + 1j * rng.normal(size=(K, len(states)))
    model, params = _determinant_of(vectors, n)
    pairs = np.array([(a, b) for a in range(len(states)) for b in range(len(states)) if a != b])
    x = jnp.asarray(states[pairs].reshape(1, len(pairs), -1), jnp.int8)
    m = np.asarray(excited.local_matrices(ham, _each(model), params, x, K))
    o = np.asarray(excited.local_matrices(op, _each(model), params, x, K))
    w = np.abs(np.linalg.det(np.moveaxis(vectors[:, pairs], 0, 1))) ** 2
    values, errors = excited.state_expectations(m, o, w[None, :])
    import scipy.linalg

    basis = vectors.T  # [D, K]: psi_i as columns
    energies, c = scipy.linalg.eigh(basis.conj().T @ dense @ basis, basis.conj().T @ basis)
    expected = [(c[:, k].conj() @ basis.conj().T @ dense_op @ basis @ c[:, k]).real
                / (c[:, k].conj() @ basis.conj().T @ basis @ c[:, k]).real for k in range(K)]
    np.testing.assert_allclose(values, expected, rtol=1e-9, atol=1e-12)
    assert abs(expected[0] - expected[1]) > 1e-2 and np.isnan(errors).all()
    np.testing.assert_allclose(excited.levels(m, w[None, :], exact=True).energies, energies, atol=1e-9)
    _, halves = excited.state_expectations(m.reshape(2, -1, K, K), o.reshape(2, -1, K, K), w.reshape(2, -1))
    assert np.all(halves > 0)


def test_state_expectations_in_an_sz_sector_drop_moves_out_of_it():
    """In a space of fixed Sz (4-site Heisenberg chain, Sz = 0), an operator whose terms leave the
    sector (X X on a bond) is measured in each state as its projection P O P on the sector: with
    `conserve_sz` the Ritz states' values, whatever the states hold outside the sector; without it,
    something else (the states' values there enter)."""
    import scipy.linalg

    n, K = 4, 2
    space = hb.chain(n, total_sz=0)
    ham = hamiltonians.heisenberg(space)
    full = hb.all_states(hb.chain(n))
    inside = np.flatnonzero(full.sum(axis=1) == 0)
    op = pauli.pauli_sum(n, [(1.0, "XX", (0, 1)), (0.5, "Z", (2,))])
    dense, dense_op = (pauli.to_sparse(o, full).toarray()[np.ix_(inside, inside)] for o in (ham, op))
    rng = np.random.default_rng(3)
    vectors = 10 * (rng.normal(size=(K, len(full))) + 1j * rng.normal(size=(K, len(full))))  # outside: large
    vectors[:, inside] = rng.normal(size=(K, len(inside))) + 1j * rng.normal(size=(K, len(inside)))
    model, params = _determinant_of(vectors, n)
    pairs = np.array([(a, b) for a in inside for b in inside if a != b])
    x = jnp.asarray(full[pairs].reshape(1, len(pairs), -1), jnp.int8)
    w = np.abs(np.linalg.det(np.moveaxis(vectors[:, pairs], 0, 1))) ** 2
    m = np.asarray(excited.local_matrices(ham, _each(model), params, x, K))
    basis = vectors[:, inside].T
    _, c = scipy.linalg.eigh(basis.conj().T @ dense @ basis, basis.conj().T @ basis)
    expected = [(c[:, k].conj() @ basis.conj().T @ dense_op @ basis @ c[:, k]).real
                / (c[:, k].conj() @ basis.conj().T @ basis @ c[:, k]).real for k in range(K)]
    kept = np.asarray(excited.local_matrices(op, _each(model), params, x, K, conserve_sz=True))
    np.testing.assert_allclose(excited.state_expectations(m, kept, w[None, :])[0], expected, rtol=1e-9, atol=1e-12)
    leaked = np.asarray(excited.local_matrices(op, _each(model), params, x, K))
    assert not np.allclose(excited.state_expectations(m, leaked, w[None, :])[0], expected, atol=1e-3)


def test_the_combination_of_the_eigenstate_coefficients_is_eigenstate_k():
    """psi_i = sum_k C_ik phi_k over the K lowest eigenstates (far from eigenstates one by one):
    the `Combination` of the determinant's states with row k of `eigenstate_coefficients` is phi_k
    (overlap 1 - 1e-10), and its dense energy <psi|H|psi>/<psi|psi> is level k, that `levels`
    reports at index k (issue 56: `state(k)` was psi_k, one copy, not the k-th eigenstate)."""
    n, K = 4, 3
    mix = _mixed_eigenstates(7, n, K)
    states, phi, energies = mix.states, mix.phi, mix.energies
    found = excited.levels(mix.m)
    rows = excited.eigenstate_coefficients(mix.m)
    assert rows.shape == (K, K) and np.allclose(np.max(np.abs(rows), axis=1), 1)
    for k in range(K):
        one = excited.Combination(base=Table(n), n_states=K, coefficients=tuple(complex(x) for x in rows[k]))
        psi = np.exp(np.asarray(one.apply({"params": mix.params}, jnp.asarray(states, jnp.int8))))
        psi /= np.linalg.norm(psi)
        assert abs(np.vdot(phi[:, k], psi)) ** 2 > 1 - 1e-10, k
        energy = np.vdot(psi, mix.dense @ psi).real
        assert energy == pytest.approx(energies[k], abs=1e-9) and energy == pytest.approx(found.energies[k], abs=1e-9)
    each = jax.vmap(lambda s: _each(mix.model)(mix.params, s))
    single = np.exp(np.asarray(each(jnp.asarray(states, jnp.int8))))[:, 2]
    assert abs(np.vdot(phi[:, 2], single / np.linalg.norm(single))) ** 2 < 0.99  # one copy alone is not phi_2
