"""The models' fast paths: declared protocols, one resolver, partial declarations refused."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import MLP, RBM
from models.common import normal
from models.fast_paths import JacobianProducts, LocalRatios, SamplerCache, check, log_abs_method, resolve
from runner.config.build import build
from runner.core import local_energy
from runner.core.jacobian import jacobian
from runner.core.local_energy import local_energies
from runner.core.precond_types import from_dense
from runner.core.wavefunction import amplitude_of, ratio_of
from runner.errors import ConfigError
from runner.physics import hamiltonians
from runner.physics import hilbert as hb
from tests.helpers.config import compose_config
from tests.helpers.dense import basis_index, dense_heisenberg, dense_psi
from tests.helpers.exact import problem_of


class ScaledRBM(RBM):
    """An RBM with one more parameter: log psi = scale * (RBM log psi). The RBM's tables,
    ratios and Jacobian products know nothing of `scale`, so it must not inherit them."""

    @nn.compact
    def __call__(self, sigma_xN):
        scale = self.param("scale", normal(0.01), (), self.param_dtype)
        return (1.5 + scale) * RBM.local_log_psi(self.features(sigma_xN))


class PartialRBM(RBM):
    """Declares the sampler cache and Jacobian products but drops a method of the cache."""

    fast_paths = (SamplerCache, JacobianProducts)
    sampler_update = None


class RedeclaredRBM(RBM):
    """A subclass that changes nothing and says so by declaring the fast paths again."""

    fast_paths = RBM.fast_paths


def test_rbm_declares_all_three_and_others_none():
    assert check(RBM) == (LocalRatios, SamplerCache, JacobianProducts)
    paths = resolve(RBM(alpha=1))
    assert paths.ratio is not None and paths.amplitude is not None and paths.jacobian_products is not None
    assert resolve(MLP(hidden=[3])) is None
    assert resolve(RedeclaredRBM(alpha=1)) is not None


def test_partial_declaration_is_refused_with_one_sentence():
    with pytest.raises(ConfigError) as info:
        check(PartialRBM)
    sentence = info.value.sentence()
    assert info.value.key == "model" and "SamplerCache" in sentence and "sampler_update" in sentence
    assert sentence.count(".") == 1 and "\n" not in sentence
    with pytest.raises(ConfigError) as info:
        resolve(PartialRBM(alpha=1))


def test_build_refuses_a_partial_declaration():
    with pytest.raises(ConfigError) as info:
        build(compose_config(["model._target_=tests.models.test_fast_paths.PartialRBM"]))
    assert info.value.key == "model" and "sampler_update" in info.value.message


@pytest.mark.slow
def test_subclass_with_other_parameters_gets_the_generic_path():
    """Inherited (hasattr) fast paths would give this subclass wrong local energies and
    log-derivatives; resolved ones fall back to full evaluations, which match dense H psi / psi."""
    lattice = hb.chain(6)
    ham = hamiltonians.heisenberg(lattice, J=1.0, J2=0.3, phase_prior="none")
    model = ScaledRBM(alpha=1)
    assert resolve(model) is None and ratio_of(model) is None
    states = jnp.asarray(hb.all_states(lattice))
    params = model.init(jax.random.PRNGKey(0), states[0])["params"]
    params = jax.tree_util.tree_map(lambda x: 30 * x, params)
    problem = problem_of(model, ham)
    eloc = local_energies(problem, params, states.reshape(4, 16, -1)).reshape(-1)
    psi = dense_psi(model.apply({"params": params}, states), np.asarray(states))
    idx = basis_index(np.asarray(states))
    H = dense_heisenberg(lattice.bonds, lattice.next_bonds, 6, 1.0, 0.3)
    np.testing.assert_allclose(np.asarray(eloc), (H @ psi)[idx] / psi[idx], rtol=1e-10)
    # The inherited RBM ratio, which ignores `scale`, would be wrong here: the check can fail.
    rbm_ratio = resolve(RBM(alpha=1)).ratio
    rbm_eloc = local_energy.local_energy(ham, problem.logpsi, params, states[5], ratio_fn=rbm_ratio)
    assert abs(rbm_eloc - (H @ psi)[idx[5]] / psi[idx[5]]) > 1e-3
    # Sampler amplitude: plain log |psi| of the subclass, not the RBM's cache nor its log_abs.
    assert log_abs_method(model) == "__call__" and log_abs_method(RBM(alpha=1)) == "log_abs"
    amp = amplitude_of(model)
    log_abs, _ = amp.init(amp.prepare(params), states[:3])
    np.testing.assert_allclose(log_abs, jnp.real(model.apply({"params": params}, states[:3])), rtol=1e-12)
    # Jacobian products from jax.linearize, equal to the dense log-derivatives.
    lazy = jacobian(problem, params, states[:40].reshape(4, 10, -1), "real")
    v = jax.random.normal(jax.random.PRNGKey(1), (lazy.dense().shape[0],))
    np.testing.assert_allclose(lazy.matvec(v), from_dense(lazy.dense(), "real").matvec(v), rtol=1e-10)


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.complex128])
@pytest.mark.slow
def test_rbm_symm_runs_on_the_rbm_updates_of_its_expanded_weights(dtype):
    """RBMSymm declares the RBM's local updates on its expanded matrix: its fast local energies
    equal dense H psi / psi, its sampler cache follows log |psi| through moves, and a projected
    instance keeps the local ratios only (`test_projected_rbms_keep_exact_local_ratios`)."""
    from models import RBMSymm

    lattice = hb.square(3)
    ham = hamiltonians.heisenberg(lattice, J=1.0, J2=0.5, phase_prior="none")
    model = RBMSymm(alpha=2, param_dtype=dtype, hilbert=lattice)
    paths = resolve(model)
    assert paths.ratio is not None and paths.amplitude is not None and paths.jacobian_products is None
    projected = resolve(RBMSymm(alpha=2, sector={"momentum": [0, 0], "irrep": "A1", "parity": 1}, hilbert=lattice))
    assert projected.ratio is not None and projected.amplitude is None and projected.jacobian_products is None
    states = jnp.asarray(hb.all_states(lattice))
    params = model.init(jax.random.PRNGKey(0), states[0])["params"]
    params = jax.tree_util.tree_map(lambda x: 20 * x, params)
    problem = problem_of(model, ham)
    picked = states[:: len(states) // 64][:64]
    eloc = local_energies(problem, params, picked.reshape(4, 16, -1)).reshape(-1)
    psi = dense_psi(model.apply({"params": params}, states), np.asarray(states))
    H = dense_heisenberg(lattice.bonds, lattice.next_bonds, 9, 1.0, 0.5)
    idx = basis_index(np.asarray(picked))
    np.testing.assert_allclose(np.asarray(eloc), (H @ psi)[idx] / psi[idx], rtol=1e-9)
    amp = amplitude_of(model)
    tables = amp.prepare(params)
    log_abs, cache = amp.init(tables, picked[:5])
    np.testing.assert_allclose(log_abs, jnp.real(model.apply({"params": params}, picked[:5])), rtol=1e-12)
    sites = jnp.array([[0, 4]] * 5)
    moved = picked[:5].at[:, jnp.array([0, 4])].multiply(-1)
    delta = moved[jnp.arange(5)[:, None], sites] - picked[:5][jnp.arange(5)[:, None], sites]
    log_abs, _ = amp.update(tables, cache, moved, sites, delta)
    np.testing.assert_allclose(log_abs, jnp.real(model.apply({"params": params}, moved)), rtol=1e-10)


@pytest.mark.parametrize("cls, sector, dtype", [
    ("RBM", {"momentum": [1, 0], "irrep": "B2", "parity": -1}, jnp.complex128),
    ("RBM", {"momentum": [0, 0], "irrep": "A1", "parity": 1}, jnp.float64),
    ("RBMSymm", {"momentum": [0, 0], "irrep": "B1"}, jnp.complex128),
    ("RBMSymm", {"momentum": [0, 0], "irrep": "A1", "parity": -1}, jnp.float64),
    ("RBMSymm_sector", {"momentum": [1, 1], "irrep": "A'", "parity": 1}, jnp.complex128),
])
def test_projected_rbms_keep_exact_local_ratios(cls, sector, dtype):
    """A projected RBM's local ratios (its images' own ratios, weighed by each image's share of
    psi_P) give the local energies of dense H psi / psi, where the sampler cache and the
    Jacobian products (which would ignore the projection) are off."""
    import models

    lattice = hb.square(3) if cls == "RBMSymm" else hb.square(None, Lx=2, Ly=4, total_sz=None)
    ham = hamiltonians.heisenberg(lattice, J=1.0, J2=0.5, phase_prior="none")
    cls, _, group = cls.partition("_")
    extra = {"group": group or "translations"} if cls == "RBMSymm" else {}
    model = getattr(models, cls)(alpha=2, param_dtype=dtype, sector=sector, hilbert=lattice, **extra)
    paths = resolve(model)
    assert paths.ratio is not None and paths.amplitude is None and paths.jacobian_products is None
    states = jnp.asarray(hb.all_states(lattice))
    params = model.init(jax.random.PRNGKey(3), states[0])["params"]
    scale = 2 if cls == "RBM" else 10  # weights of order 1 (the RBM starts projections at 1/sqrt(N))
    params = jax.tree_util.tree_map(lambda x: scale * x, params)
    psi = dense_psi(model.apply({"params": params}, states), np.asarray(states))
    picked = states[np.argsort(-np.abs(psi[basis_index(np.asarray(states))]))[:64]]  # away from psi_P = 0
    eloc = local_energies(problem_of(model, ham), params, picked.reshape(4, 16, -1)).reshape(-1)
    H = dense_heisenberg(lattice.bonds, lattice.next_bonds, lattice.n_sites, 1.0, 0.5)
    idx = basis_index(np.asarray(picked))
    np.testing.assert_allclose(np.asarray(eloc), (H @ psi)[idx] / psi[idx], rtol=1e-9, atol=1e-9)
