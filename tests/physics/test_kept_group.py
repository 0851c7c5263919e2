"""The space group a Hamiltonian keeps (`symmetry.kept_group`, carried by the run's Hilbert space) against
dense U(g) H U(g)^dagger, the sectors, the full sum and the symmetric models over it, and `phase_prior: auto`."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import scipy.sparse as sp

from runner.config.build import build
from runner.core import precond
from runner.core import sampler as smp
from runner.core.problem import Problem
from runner.core.vmc import full_sum_invariance_error
from runner.errors import ConfigError
from runner.physics import exact, hamiltonians, pauli, spectrum, symmetry
from runner.physics import hilbert as hb
from tests.helpers.config import compose_config
from tests.helpers.dense import basis_index, dense_heisenberg, dense_psi
from tests.helpers.steps import full_sum_step

RECIPE = ["experiment=triangular_heisenberg", "observables=none"]
TRIANGULAR3 = [*RECIPE, "hilbert.L=3", "hilbert.total_sz=0.5"]


def dense_rotated(lattice, prior):
    """U H U^dagger of heisenberg's `prior` as a dense 2^n matrix, U from the rotation H records."""
    n = lattice.n_sites
    ham = hamiltonians.heisenberg(lattice, phase_prior=prior)
    theta = dict(zip(ham.rotated or (), ham.angles or (math.pi,) * len(ham.rotated or ())))
    u = functools.reduce(np.kron, [np.exp(-0.5j * theta.get(i, 0.0) * np.array([1.0, -1.0])) for i in range(n)])
    H = dense_heisenberg(lattice.bonds, lattice.next_bonds, n, 1.0, 0.0)
    return ham, (u[:, None] * H) * u.conj()[None, :]


def permutation_matrix(perm, states):
    """U(g) on the 2^n basis of every configuration `states`: (U psi)(s) = psi(g s), (g s)_i = s_{perm[i]}."""
    n = states.shape[1]
    return sp.csr_matrix((np.ones(len(states)), (basis_index(states), basis_index(states[:, perm]))),
                         shape=(2**n, 2**n))


def test_kept_group_is_exactly_the_elements_that_commute_3x3():
    """Each of the 108 elements of the 3 x 3 torus is kept exactly where the dense U(g) H U(g)^dagger = H for
    the three-sublattice H: 54 of them, every translation; without a prior the whole group is kept."""
    lattice = hb.triangular(3)
    group = lattice.space_group
    ham, H = dense_rotated(lattice, "three_sublattice")
    states = hb.all_states(lattice)
    commutes = [np.allclose(P @ H @ P.T, H, atol=1e-12) for P in (permutation_matrix(p, states) for p in group.perm_ExN)]
    kept = symmetry.kept_group(ham, group)
    assert {tuple(r) for r in kept.perm_ExN.tolist()} == {tuple(r) for r, c in zip(group.perm_ExN.tolist(), commutes) if c}
    assert sum(commutes) == len(kept.perm_ExN) == 54 and not all(commutes)
    np.testing.assert_array_equal(kept.rows("translations"), group.rows("translations"))
    assert symmetry.irreps(kept.ops)[0] == "C3v"
    plain = hamiltonians.heisenberg(lattice, phase_prior="none")
    assert symmetry.kept_group(plain, group) is group


def test_kept_group_of_the_3x6_torus_commutes_with_h_and_holds_every_translation():
    """On the 3 x 6 torus (C2v) the three-sublattice H keeps the translations and one mirror (Cs); every
    element left out fails U(g) H U(g)^dagger = H on the Sz = 0 space."""
    lattice = hb.triangular(Lx=3, Ly=6, total_sz=0)
    ham = hamiltonians.heisenberg(lattice, phase_prior="three_sublattice")
    group, kept = lattice.space_group, symmetry.kept_group(ham, lattice.space_group)
    codes = symmetry.basis_codes(lattice)
    H = pauli.to_sparse(ham, hb.all_states(lattice))
    inside = {tuple(r) for r in kept.perm_ExN.tolist()}
    for perm in group.perm_ExN[::5]:
        image = np.searchsorted(codes, symmetry.image_codes(codes, perm, 18))
        P = sp.csr_matrix((np.ones(len(codes)), (np.arange(len(codes)), image)), shape=(len(codes),) * 2)
        assert (abs(P @ H @ P.T - H).max() < 1e-12) == (tuple(perm.tolist()) in inside)
    assert len(kept.perm_ExN) == 36 and symmetry.irreps(kept.ops)[0] == "Cs"
    np.testing.assert_array_equal(kept.rows("translations"), group.rows("translations"))


def test_a_hamiltonian_without_a_translation_keeps_the_lattice_group_and_its_refusals():
    lattice = hb.chain(6, total_sz=0)
    field = hamiltonians.pauli(lattice, [{"coeff": 1.0, "ops": "ZZ", "on": "bonds"}, {"coeff": 0.3, "ops": "Z", "on": [[0]]}])
    with pytest.raises(ValueError, match="does not commute with the translation 1"):
        symmetry.kept_group(field, lattice.space_group)
    assert symmetry.keeping(lattice, field) is lattice


def test_sector_auto_over_the_kept_group_is_the_dense_ground_state_3x3():
    """The recipe on the 3 x 3 torus at Sz = 1/2 (auto: three_sublattice) resolves sector auto over the kept
    C3v x translations: k=(0,0) A1, whose lowest level, in the sector's basis and in the dense H projected
    onto that basis, is the dense ground energy -21 of H."""
    experiment = build(compose_config(TRIANGULAR3))
    lattice = experiment.hilbert
    assert len(lattice.space_group.perm_ExN) == 54 and experiment.hamiltonian.angles is not None
    assert experiment.sector == symmetry.Sector((0, 0), "A1", None, 0.5)
    _, H = dense_rotated(hb.triangular(3), "three_sublattice")
    idx = basis_index(hb.all_states(lattice))
    ground = np.linalg.eigvalsh(H[np.ix_(idx, idx)])[0]
    np.testing.assert_allclose(ground, -21.0, atol=1e-9)
    level = spectrum.lowest_levels_in(experiment.hamiltonian, lattice, 1, experiment.sector)[0]
    B = spectrum.sector_basis(lattice, experiment.sector).toarray()
    projected = np.linalg.eigvalsh(B.conj().T @ H[np.ix_(idx, idx)] @ B)[0]
    np.testing.assert_allclose([level, projected], [ground, ground], atol=1e-9)
    np.testing.assert_allclose(spectrum.ground_sector(experiment.hamiltonian, lattice)[1], ground, atol=1e-9)


def test_explicit_sectors_of_the_kept_group_and_the_groups_built_over_it():
    """An irrep of the lattice's C6v that the kept C3v lacks is refused in one sentence; auto beyond the exact
    solver is the kept group's trivial sector; rbm_symm's groups and full_sum_lattice use the kept elements."""
    with pytest.raises(ConfigError, match="must be one of A1, A2.* within the 54 of the lattice's 108") as info:
        build(compose_config([*TRIANGULAR3, "model.sector={momentum: [0, 0], irrep: B1}"]))
    assert info.value.key == "model.sector.irrep"
    off = build(compose_config([*TRIANGULAR3, "exact=false", "sampler=metropolis_exchange"]))
    assert off.sector == symmetry.Sector((0, 0), "A1", None, 0.5)
    assert off.problem.model.group_GxN().shape == (54, 9)
    lattice = build(compose_config([*TRIANGULAR3, "model.group=lattice", "model.sector=null"]))
    assert lattice.problem.model.group_GxN().shape == (54, 9)
    assert lattice.problem.sampler.symmetry == "lattice" and lattice.problem.sampler.n_configurations == 5


def _energy(problem, params):
    """The energy of one full-sum step at `params`."""
    return complex(full_sum_step(problem, params)[0].mean).real


def test_full_sum_lattice_with_a_prior_is_the_dense_sum():
    """The recipe's sum over the kept group's orbits (5 of the 126 configurations at Sz = 1/2) gives a fixed
    symmetric model's energy as the dense <psi|U H U^dagger|psi> / <psi|psi> over every configuration."""
    experiment = build(compose_config([*TRIANGULAR3, "model.alpha=2"]))
    problem = experiment.problem
    model, lattice = problem.model, experiment.hilbert
    params = model.init(jax.random.PRNGKey(3), jnp.ones(9, jnp.int8))["params"]
    params = jax.tree_util.tree_map(lambda x: 10 * x, params)  # far from uniform
    assert full_sum_invariance_error(problem, [params]) is None
    states = hb.all_states(lattice)
    psi = dense_psi(model.apply({"params": params}, jnp.asarray(states)), states)
    _, H = dense_rotated(hb.triangular(3), "three_sublattice")
    dense = float(np.real(psi.conj() @ H @ psi) / np.real(psi.conj() @ psi))
    assert abs(dense - exact.energy_of(experiment.hamiltonian, lattice, np.exp(model.apply(
        {"params": params}, jnp.asarray(states))))) < 1e-9 * abs(dense)
    summed = _energy(problem, params)
    every = _energy(Problem(problem.hamiltonian, model, smp.full_sum(lattice, n_chains=4), optax.sgd(0.1),
                            precond.sr(diag_shift=0.05, solver="cholesky")), params)
    np.testing.assert_allclose([summed, every], [dense, dense], rtol=1e-10)


@pytest.mark.parametrize("make,resolved", [
    (lambda: hb.square(4, total_sz=0), "marshall"),
    (lambda: hb.triangular(3, total_sz=0.5), "three_sublattice"),
    (lambda: hb.triangular(4, total_sz=0), "none"),
])
def test_auto_prior_is_the_classical_order_the_torus_admits(make, resolved):
    """auto is marshall on the square 4 x 4, three_sublattice on the triangular 3 x 3 and none on the
    triangular 4 x 4: the same H as that value, with the spectrum of the unrotated H."""
    lattice = make()
    assert hamiltonians.auto_prior(lattice) == resolved
    auto = hamiltonians.heisenberg(lattice, phase_prior="auto")
    same = hamiltonians.heisenberg(lattice, phase_prior=resolved)
    assert auto.terms == same.terms and auto.rotated == same.rotated and auto.angles == same.angles
    plain = hamiltonians.heisenberg(lattice, phase_prior="none")
    if lattice.n_sites <= 9:
        dense = [np.linalg.eigvalsh(pauli.to_sparse(h, hb.all_states(lattice)).toarray()) for h in (auto, plain)]
        np.testing.assert_allclose(dense[0], dense[1], atol=1e-9)
    else:
        levels = [spectrum.lowest_levels_in(h, lattice, 4) for h in (auto, plain)]
        np.testing.assert_allclose(levels[0], levels[1], atol=1e-8)
    assert hamiltonians.auto_prior(lattice, J=-1.0) == "none"


def test_auto_with_a_real_wavefunction():
    """auto's three_sublattice is refused for a real log psi like the explicit value (one sentence naming
    what auto chose); where auto resolves to none a real dtype builds."""
    with pytest.raises(ConfigError, match=r"auto \(three_sublattice on this lattice\) gives H complex") as info:
        build(compose_config([*TRIANGULAR3, "dtype=float64"]))
    assert info.value.key == "hamiltonian.phase_prior"
    square = ["hilbert=triangular", "hilbert.L=4", "hilbert.total_sz=0", "hamiltonian=heisenberg",
              "hamiltonian.phase_prior=auto", "sampler=metropolis_exchange", "dtype=float64"]
    assert build(compose_config(square)).hamiltonian.rotated is None


def test_the_recipe_on_4x4_and_3x4_is_the_unrotated_problem():
    """auto is none on the recipe's 4 x 4 and on 3 x 4: the Hamiltonian and the space group the run carries are
    those of phase_prior=null, so the runs' numbers do not move."""
    for size in ([], ["hilbert.L=null", "hilbert.Lx=3", "hilbert.Ly=4"]):
        auto = build(compose_config([*RECIPE, *size, "exact=false"]))
        null = build(compose_config([*RECIPE, *size, "exact=false", "hamiltonian.phase_prior=null"]))
        assert auto.hamiltonian.terms == null.hamiltonian.terms and auto.hamiltonian.rotated is None
        assert auto.hilbert.space_group == null.hilbert.space_group
