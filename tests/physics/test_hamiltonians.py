"""Local energies and sparse matrices against dense Pauli-Kronecker Hamiltonians."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import RBM
from runner.core import local_energy
from runner.core.wavefunction import ratio_of
from runner.errors import ConfigError
from runner.physics import hamiltonians, pauli
from runner.physics import hilbert as hb
from tests.helpers.dense import Z, basis_index, dense_heisenberg, dense_ising, dense_pauli, dense_psi, dense_rotation, site_op
from tests.helpers.lattices import SMALL_LATTICES, hamiltonian_and_dense
from tests.helpers.pairwise import pairwise

LATTICES = {
    "chain6_pbc": lambda **kw: hb.chain(6, pbc=True, **kw),
    "chain5_obc": lambda **kw: hb.chain(5, pbc=False, **kw),
    "square2x3_obc": lambda **kw: hb.square(Lx=2, Ly=3, pbc=False, **kw),
    "square3x3_pbc": lambda **kw: hb.square(3, pbc=True, **kw),
}


def _reference(ham_name, lattice, J, coupling, prior):
    n = lattice.n_sites
    if ham_name == "ising":
        return dense_ising(lattice.bonds, n, J, coupling)
    sub = lattice.sublattice if prior == "marshall" else None
    return dense_heisenberg(lattice.bonds, lattice.next_bonds, n, J, coupling, sub)


VARIANTS = [("ising", None), ("heisenberg", "none"), ("heisenberg", "marshall")]
NOT_BIPARTITE = ("square3x3_pbc",)  # no Marshall rotation


def _allowed(case):
    (_, prior), lattice_name, *_ = case
    return not (prior == "marshall" and lattice_name in NOT_BIPARTITE)


CASES = [(ham_name, name, rule) for (ham_name, rule), name in itertools.product(VARIANTS, LATTICES)
         if _allowed(((ham_name, rule), name))]


# The local energy's paths depend on the Hamiltonian and lattice (the connected configurations) and on
# the parameters' dtype (the RBM's ratio tables), never on all three: every pair of the three, 11 cases.
@pytest.mark.parametrize("variant,lattice_name,param_dtype",
                         pairwise(VARIANTS, list(LATTICES), [jnp.complex128, jnp.float64], allowed=_allowed))
@pytest.mark.slow
def test_local_energy_matches_dense(variant, lattice_name, param_dtype):
    ham_name, prior = variant
    lattice = LATTICES[lattice_name]()
    if ham_name == "ising":
        ham = hamiltonians.ising(lattice, J=0.8, h=1.3)
        H = _reference("ising", lattice, 0.8, 1.3, None)
    else:
        ham = hamiltonians.heisenberg(lattice, J=1.1, J2=0.4, phase_prior=prior)
        H = _reference("heisenberg", lattice, 1.1, 0.4, prior)
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
        e_loc = lambda s: local_energy.local_energy(ham, logpsi, params, s, ratio_fn=ratio)  # noqa: E731
        eloc = jax.jit(jax.vmap(e_loc))(jnp.asarray(states))
        np.testing.assert_allclose(np.asarray(eloc), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("ham_name,lattice_name,prior", CASES)
def test_sparse_matches_dense(ham_name, lattice_name, prior):
    lattice = LATTICES[lattice_name]()
    if ham_name == "ising":
        ham, H = hamiltonians.ising(lattice, 0.8, 1.3), _reference("ising", lattice, 0.8, 1.3, None)
    else:
        ham = hamiltonians.heisenberg(lattice, 1.1, 0.4, prior)
        H = _reference("heisenberg", lattice, 1.1, 0.4, prior)
    states = hb.all_states(lattice)
    idx = basis_index(states)
    np.testing.assert_allclose(pauli.to_sparse(ham, states).toarray(), H[np.ix_(idx, idx)].real, atol=1e-12)


def test_sz_sector_block_and_marshall_spectrum():
    lattice = hb.chain(8, total_sz=0)
    for J2 in (0.0, 0.5):
        plain = pauli.to_sparse(hamiltonians.heisenberg(lattice, 1.0, J2, "none"), hb.all_states(lattice))
        rotated = pauli.to_sparse(hamiltonians.heisenberg(lattice, 1.0, J2, "marshall"), hb.all_states(lattice))
        np.testing.assert_allclose(np.linalg.eigvalsh(plain.toarray()), np.linalg.eigvalsh(rotated.toarray()), atol=1e-10)
    full = _reference("heisenberg", hb.chain(8), 1.0, 0.0, "none")
    idx = basis_index(hb.all_states(lattice))
    sector = pauli.to_sparse(hamiltonians.heisenberg(lattice, 1.0, 0.0, "none"), hb.all_states(lattice)).toarray()
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
        (lambda: hamiltonians.heisenberg(hb.chain(5), phase_prior="marshall"), "phase_prior"),
        (lambda: hamiltonians.ising(hb.chain(4, total_sz=0)), "hilbert.total_sz"),
        (lambda: hamiltonians.ising(hb.chain(4), h="strong"), "h"),
        (lambda: hamiltonians.heisenberg(hb.triangular(3), phase_prior="marshall"), "phase_prior"),
        (lambda: hamiltonians.heisenberg(hb.chain(3), J2=0.5), "J2"),
        (lambda: hamiltonians.xxz(hb.chain(4), Delta=None), "Delta"),
        (lambda: hamiltonians.pauli(hb.chain(3), [{"coeff": 1.0, "ops": "ZZ", "on": "next_bonds"}]), "terms[0].on"),
        (lambda: hamiltonians.pauli(hb.chain(4), [{"coeff": "1j", "ops": "ZZ", "on": "bonds"}]), "terms"),
        (lambda: hamiltonians.pauli(hb.chain(4), [{"coeff": 1.0, "ops": "ZZ", "on": [[0, 1, 2]]}]), "terms[0].on"),
        (lambda: hamiltonians.pauli(hb.chain(4), [{"coeff": 1.0, "ops": "ZQ", "on": "bonds"}]), "terms[0].ops"),
        (lambda: hamiltonians.pauli(hb.chain(4), [{"coeff": "big", "ops": "Z", "on": "sites"}]), "terms[0].coeff"),
        (lambda: hamiltonians.pauli(hb.chain(4, total_sz=0), [{"coeff": 1.0, "ops": "XZ", "on": "bonds"}]), "hilbert.total_sz"),
    ],
)
def test_bad_values_raise_config_error(make, key):
    with pytest.raises(ConfigError) as info:
        make()
    assert info.value.key == key


# --- every lattice kind and every Hamiltonian kind against dense Kronecker products ---------

KINDS = ["ising", "heisenberg", "xxz", "pauli"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("lattice_name", list(SMALL_LATTICES))
@pytest.mark.slow
def test_every_lattice_and_hamiltonian_matches_dense(lattice_name, kind):
    lattice = SMALL_LATTICES[lattice_name]()
    ham, H = hamiltonian_and_dense(kind, lattice)
    assert np.allclose(H, H.conj().T)
    states = hb.all_states(lattice)
    idx = basis_index(states)
    H = H[np.ix_(idx, idx)]
    np.testing.assert_allclose(pauli.to_sparse(ham, states).toarray(), H, atol=1e-12)
    # connected(): the same elements, row by row
    for row in (0, 5, len(states) - 1):
        sigmap_KxN, mel_K, diag = local_energy.connected(ham, jnp.asarray(states[row]))
        np.testing.assert_allclose(diag, H[row, row].real, atol=1e-12)
        cols = np.searchsorted(hb.states_to_codes(states), hb.states_to_codes(np.asarray(sigmap_KxN)))
        np.testing.assert_allclose(np.asarray(mel_K), H[row, cols], atol=1e-12)
    # exact properties against the dense matrix
    Sz = sum(site_op(Z, i, lattice.n_sites) for i in range(lattice.n_sites))[np.ix_(idx, idx)]
    assert pauli.conserves_sz(ham) == np.allclose(H @ Sz, Sz @ H)
    off = H - np.diag(np.diag(H))
    assert pauli.is_stoquastic(ham) == bool(np.all(np.abs(off.imag) < 1e-12) and np.all(off.real < 1e-12))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("lattice_name", ["chain5_obc", "triangular3_pbc", "honeycomb2_pbc", "kagome1x2_obc", "graph5"])
@pytest.mark.slow
def test_local_energies_of_every_hamiltonian_match_dense(lattice_name, kind):
    lattice = SMALL_LATTICES[lattice_name]()
    ham, H = hamiltonian_and_dense(kind, lattice)
    states = hb.all_states(lattice)
    model = RBM(alpha=1, param_dtype=jnp.complex128)
    params = model.init(jax.random.PRNGKey(5), states[0])["params"]
    params = jax.tree_util.tree_map(lambda x: x * 20, params)
    logpsi = lambda p, s: model.apply({"params": p}, s)  # noqa: E731
    psi = dense_psi(logpsi(params, jnp.asarray(states)), states)
    idx = basis_index(states)
    expected = (H @ psi)[idx] / psi[idx]
    for ratio in (None, ratio_of(model)):
        e_loc = jax.jit(jax.vmap(lambda s: local_energy.local_energy(ham, logpsi, params, s, ratio_fn=ratio)))  # noqa: B023
        np.testing.assert_allclose(np.asarray(e_loc(jnp.asarray(states))), expected, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("use_ratio", [False, True])
def test_zero_elements_do_not_multiply_overflowing_ratios(use_ratio):
    """Issue 11a: Heisenberg L=8, Sz=0, float32 RBM with a uniform visible bias of 25: a flip of
    a parallel pair (element 0) has psi ratio e^{+-100}, inf in float32; E_loc must stay finite."""
    lattice = hb.chain(8, total_sz=0)
    ham = hamiltonians.heisenberg(lattice)
    states = jnp.asarray(hb.all_states(lattice))
    model32, model64 = RBM(alpha=1, param_dtype=jnp.float32), RBM(alpha=1, param_dtype=jnp.float64)
    params = model32.init(jax.random.PRNGKey(0), states[0])["params"]
    params = {**params, "visible_bias": jnp.full_like(params["visible_bias"], 25.0)}
    params64 = jax.tree_util.tree_map(lambda x: x.astype(jnp.float64), params)
    ratio = ratio_of(model32) if use_ratio else None
    logpsi32 = lambda p, s: model32.apply({"params": p}, s)  # noqa: E731
    eloc = jax.jit(jax.vmap(lambda s: local_energy.local_energy(ham, logpsi32, params, s, ratio_fn=ratio)))(states)
    assert np.all(np.isfinite(np.asarray(eloc)))
    H = pauli.to_sparse(ham, np.asarray(states)).toarray()
    psi = np.exp(np.asarray(model64.apply({"params": params64}, states), np.float64))
    np.testing.assert_allclose(np.asarray(eloc, np.float64), (H @ psi) / psi, rtol=2e-4, atol=2e-4)
    weights = psi**2 / np.sum(psi**2)
    np.testing.assert_allclose(np.sum(weights * np.asarray(eloc, np.float64)), psi @ H @ psi / (psi @ psi), rtol=1e-4)


def test_phase_prior_default_marshall_only_where_it_makes_h_stoquastic():
    chain = hb.chain(6)
    antiferro = hamiltonians.heisenberg(chain, J=1.0)
    assert antiferro.rotated == tuple(np.nonzero(chain.sublattice)[0]) and pauli.is_stoquastic(antiferro)
    ferro = hamiltonians.heisenberg(chain, J=-1.0)
    assert ferro.rotated is None and pauli.is_stoquastic(ferro)
    frustrated = hamiltonians.heisenberg(chain, J=1.0, J2=0.5)
    assert frustrated.rotated is None and not pauli.is_stoquastic(frustrated)
    forced = hamiltonians.heisenberg(chain, J=1.0, J2=0.5, phase_prior="marshall")
    assert forced.rotated is not None
    states = hb.all_states(chain)
    np.testing.assert_allclose(np.linalg.eigvalsh(pauli.to_sparse(forced, states).toarray()),
                               np.linalg.eigvalsh(pauli.to_sparse(frustrated, states).toarray()), atol=1e-10)
    assert hamiltonians.heisenberg(chain, phase_prior="none").rotated is None
    assert hamiltonians.heisenberg(hb.triangular(3)).rotated is None  # not bipartite: default off
    with pytest.raises(ConfigError) as info:
        hamiltonians.heisenberg(hb.triangular(3), phase_prior="marshall")
    assert info.value.key == "phase_prior"


def test_rotate_like_maps_observables_into_the_simulated_basis():
    lattice = hb.chain(4, pbc=False)
    ham = hamiltonians.heisenberg(lattice)  # Marshall-rotated on sites 1, 3
    assert ham.rotated == (1, 3)
    terms = [(0.5, "XX", (0, 1)), (-0.3, "YZ", (1, 2)), (0.2, "Z", (3,)), (0.1, "XY", (2, 3))]
    obs = pauli.pauli_sum(4, terms)
    rotated = pauli.rotate_like(ham, obs)
    U = dense_rotation((1, 3), 4)
    states = hb.all_states(lattice)
    idx = basis_index(states)
    np.testing.assert_allclose(pauli.to_sparse(rotated, states).toarray(), (U @ dense_pauli(terms, 4) @ U)[np.ix_(idx, idx)],
                               atol=1e-12)
    assert pauli.rotate(rotated, (1, 3)).terms == obs.terms  # U U = 1
    # <psi|O|psi> = <U psi|U O U|U psi>
    psi = np.random.default_rng(0).standard_normal(16) + 0j
    H_obs = dense_pauli(terms, 4)
    np.testing.assert_allclose(psi.conj() @ H_obs @ psi, (U @ psi).conj() @ (U @ H_obs @ U) @ (U @ psi))


def test_pauli_sum_combines_strings_and_checks_hermiticity():
    op = pauli.pauli_sum(3, [(0.5, "XX", (0, 1)), (1.0, "YY", (0, 1)), (0.5, "XX", (1, 0))])
    assert len(op.terms) == 2 and op.n_connected == 1
    # X X + Y Y on a parallel pair: one connected configuration with element 0
    _, mel_K, _ = local_energy.connected(op, jnp.array([1, 1, -1], jnp.int8))
    np.testing.assert_allclose(mel_K, [0.0])
    with pytest.raises(ConfigError):
        pauli.pauli_sum(2, [(1j, "XY", (0, 1))])
    assert pauli.pauli_sum(2, [(1j, "XY", (0, 0))]).terms == ((-1.0, "Z", (0,)),)
    assert pauli.pauli_sum(2, [(1.0, "ZZ", (0, 1)), (-1.0, "ZZ", (1, 0))]).terms == ()


def test_next_bond_shell_convention_against_dense():
    """Issue 11c: chain L=4's next bonds (0, 2), (1, 3) each once; L=3 refuses J2."""
    lattice = hb.chain(4)
    ham = hamiltonians.heisenberg(lattice, J=1.0, J2=0.7, phase_prior="none")
    H = dense_heisenberg([(0, 1), (1, 2), (2, 3), (0, 3)], [(0, 2), (1, 3)], 4, 1.0, 0.7)
    np.testing.assert_allclose(pauli.to_sparse(ham, hb.all_states(lattice)).toarray(),
                               H[np.ix_(basis_index(hb.all_states(lattice)), basis_index(hb.all_states(lattice)))], atol=1e-12)
    for make in (lambda: hamiltonians.heisenberg(hb.chain(3), J2=0.5),
                 lambda: hamiltonians.pauli(hb.chain(3), [{"coeff": 1.0, "ops": "XX", "on": "next_bonds"}])):
        with pytest.raises(ConfigError, match="next"):
            make()
    assert hamiltonians.heisenberg(hb.chain(3), J2=0.0).n_connected == 3


def test_build_refuses_exchange_sampler_for_non_conserving_h_and_warns_on_signs(caplog):
    from runner.config.build import build
    from tests.helpers.config import compose_config

    with pytest.raises(ConfigError) as info:
        build(compose_config(["hamiltonian=ising", "sampler=metropolis_exchange"]))
    assert info.value.key == "sampler"
    with pytest.raises(ConfigError) as info:
        build(compose_config(["hamiltonian=pauli", "hilbert.total_sz=0", "sampler=metropolis_exchange"]))
    assert info.value.key == "hilbert.total_sz"
    build(compose_config(["hamiltonian=xxz", "hilbert.total_sz=0", "sampler=metropolis_exchange"]))
    caplog.clear()
    with caplog.at_level("WARNING"):
        build(compose_config(["hamiltonian=heisenberg", "hilbert.total_sz=0", "sampler=metropolis_exchange"]))
        assert not [r for r in caplog.records if "stoquastic" in r.getMessage()]
        build(compose_config(["hamiltonian=heisenberg", "hamiltonian.phase_prior=none", "hilbert.total_sz=0",
                              "sampler=metropolis_exchange"]))
        build(compose_config(["hamiltonian=heisenberg", "hamiltonian.phase_prior=none", "hilbert.total_sz=0",
                              "sampler=metropolis_exchange", "dtype=complex128"]))
        # real parameters, complex log psi: the ViT's output layer and a parity -1 projection carry phases
        build(compose_config(["hilbert=square", "hilbert.L=4", "hamiltonian=heisenberg", "hamiltonian.phase_prior=none",
                              "hilbert.total_sz=0", "sampler=metropolis_exchange", "model=vit", "model.patch_size=2"]))
        build(compose_config(["hilbert=square", "hilbert.L=4", "hamiltonian=heisenberg", "hamiltonian.phase_prior=none",
                              "hilbert.total_sz=0", "sampler=metropolis_exchange", "model=cnn",
                              "model.sector={momentum:[0,0],irrep:A1,parity:-1}"]))
    assert len([r for r in caplog.records if "stoquastic" in r.getMessage()]) == 1


def test_pauli_config_option_reads_yaml_terms():
    from runner.config.build import build
    from tests.helpers.config import compose_config

    experiment = build(compose_config(["hamiltonian=pauli", "hilbert.L=6"]))
    reference = hamiltonians.ising(experiment.hilbert, J=1.0, h=1.0)
    assert experiment.hamiltonian.terms == reference.terms
