"""Local energies and sparse matrices against dense Pauli-Kronecker Hamiltonians."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import RBM
from runner import hilbert as hb
from runner import operators
from runner.errors import ConfigError
from runner.vmc import ratio_of
from tests.dense import basis_index, dense_heisenberg, dense_ising

LATTICES = {
    "chain6_pbc": lambda **kw: hb.chain(6, pbc=True, **kw),
    "chain5_obc": lambda **kw: hb.chain(5, pbc=False, **kw),
    "square2x3_obc": lambda **kw: hb.square(Lx=2, Ly=3, pbc=False, **kw),
    "square3x3_pbc": lambda **kw: hb.square(3, pbc=True, **kw),
}


def _reference(ham_name, lattice, J, coupling, sign_rule):
    n = lattice.n_sites
    if ham_name == "ising":
        return dense_ising(lattice.bonds, n, J, coupling)
    sub = lattice.sublattice if sign_rule else None
    return dense_heisenberg(lattice.bonds, lattice.next_bonds, n, J, coupling, sub)


CASES = [
    ("ising", name, None) for name in LATTICES
] + [
    ("heisenberg", name, rule)
    for name in LATTICES
    for rule in (False, True)
    if not (rule and name == "square3x3_pbc")  # 3x3 periodic is not bipartite
]


@pytest.mark.parametrize("param_dtype", [jnp.complex128, jnp.float64])
@pytest.mark.parametrize("ham_name,lattice_name,sign_rule", CASES)
def test_local_energy_matches_dense(ham_name, lattice_name, sign_rule, param_dtype):
    lattice = LATTICES[lattice_name]()
    if ham_name == "ising":
        ham = operators.ising(lattice, J=0.8, h=1.3)
        H = _reference("ising", lattice, 0.8, 1.3, None)
    else:
        ham = operators.heisenberg(lattice, J=1.1, J2=0.4, sign_rule=sign_rule)
        H = _reference("heisenberg", lattice, 1.1, 0.4, sign_rule)
    assert np.allclose(H, H.conj().T)
    states = hb.all_states(lattice)
    model = RBM(alpha=1, param_dtype=param_dtype)
    params = model.init(jax.random.PRNGKey(3), states[0])["params"]
    params = jax.tree_util.tree_map(lambda x: x * 30, params)  # far from uniform
    logpsi = lambda p, s: model.apply({"params": p}, s)  # noqa: E731
    psi = np.zeros(2**lattice.n_sites, complex)
    psi[basis_index(states)] = np.exp(np.asarray(logpsi(params, jnp.asarray(states))))
    expected = (H @ psi)[basis_index(states)] / psi[basis_index(states)]
    # Full evaluations of the connected configurations, and the RBM's cosh-ratio tables.
    for ratio in (None, ratio_of(model)):
        e_loc = lambda s: operators.local_energy(ham, logpsi, params, s, ratio_fn=ratio)  # noqa: E731
        eloc = jax.jit(jax.vmap(e_loc))(jnp.asarray(states))
        np.testing.assert_allclose(np.asarray(eloc), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("ham_name,lattice_name,sign_rule", CASES)
def test_sparse_matches_dense(ham_name, lattice_name, sign_rule):
    lattice = LATTICES[lattice_name]()
    if ham_name == "ising":
        ham, H = operators.ising(lattice, 0.8, 1.3), _reference("ising", lattice, 0.8, 1.3, None)
    else:
        ham = operators.heisenberg(lattice, 1.1, 0.4, sign_rule)
        H = _reference("heisenberg", lattice, 1.1, 0.4, sign_rule)
    states = hb.all_states(lattice)
    idx = basis_index(states)
    np.testing.assert_allclose(operators.to_sparse(ham, states).toarray(), H[np.ix_(idx, idx)].real, atol=1e-12)


def test_sz_sector_block_and_sign_rule_spectrum():
    lattice = hb.chain(8, total_sz=0)
    for J2 in (0.0, 0.5):
        plain = operators.to_sparse(operators.heisenberg(lattice, 1.0, J2, False), hb.all_states(lattice))
        rotated = operators.to_sparse(operators.heisenberg(lattice, 1.0, J2, True), hb.all_states(lattice))
        np.testing.assert_allclose(np.linalg.eigvalsh(plain.toarray()), np.linalg.eigvalsh(rotated.toarray()), atol=1e-10)
    full = _reference("heisenberg", hb.chain(8), 1.0, 0.0, False)
    idx = basis_index(hb.all_states(lattice))
    sector = operators.to_sparse(operators.heisenberg(lattice, 1.0, 0.0, False), hb.all_states(lattice)).toarray()
    np.testing.assert_allclose(sector, full[np.ix_(idx, idx)].real, atol=1e-12)


def test_lattice_geometry():
    chain = hb.chain(6)
    assert len(chain.bonds) == 6 and len(chain.next_bonds) == 6
    assert hb.chain(6, pbc=False).bonds.shape == (5, 2)
    sq = hb.square(4)
    assert len(sq.bonds) == 32 and len(sq.next_bonds) == 32 and sq.sublattice is not None
    assert hb.square(Lx=3, Ly=4, pbc=False).n_sites == 12
    assert hb.chain(5).sublattice is None and hb.chain(5, pbc=False).sublattice is not None


@pytest.mark.parametrize(
    "make,key",
    [
        (lambda: hb.chain(5, total_sz=0), "total_sz"),
        (lambda: hb.chain(4, total_sz=3), "total_sz"),
        (lambda: hb.chain(-3), "L"),
        (lambda: hb.chain(2), "L"),
        (lambda: hb.chain(4.5), "L"),
        (lambda: operators.heisenberg(hb.chain(5), sign_rule=True), "sign_rule"),
        (lambda: operators.ising(hb.chain(4, total_sz=0)), "hilbert.total_sz"),
        (lambda: operators.ising(hb.chain(4), h="strong"), "h"),
        (lambda: operators.heisenberg(hb.triangular(3), sign_rule=True), "sign_rule"),
        (lambda: operators.heisenberg(hb.chain(3), J2=0.5), "J2"),
        (lambda: operators.xxz(hb.chain(4), Delta=None), "Delta"),
        (lambda: operators.pauli(hb.chain(3), [{"coeff": 1.0, "ops": "ZZ", "on": "next_bonds"}]), "terms[0].on"),
        (lambda: operators.pauli(hb.chain(4), [{"coeff": "1j", "ops": "ZZ", "on": "bonds"}]), "terms"),
        (lambda: operators.pauli(hb.chain(4), [{"coeff": 1.0, "ops": "ZZ", "on": [[0, 1, 2]]}]), "terms[0].on"),
        (lambda: operators.pauli(hb.chain(4), [{"coeff": 1.0, "ops": "ZQ", "on": "bonds"}]), "terms[0].ops"),
        (lambda: operators.pauli(hb.chain(4), [{"coeff": "big", "ops": "Z", "on": "sites"}]), "terms[0].coeff"),
        (lambda: operators.pauli(hb.chain(4, total_sz=0), [{"coeff": 1.0, "ops": "XZ", "on": "bonds"}]), "hilbert.total_sz"),
    ],
)
def test_bad_values_raise_config_error(make, key):
    with pytest.raises(ConfigError) as info:
        make()
    assert info.value.key == key
