"""The sectors a wavefunction can reach, measured, against the exact spectrum of kagome 2x2
(Heisenberg, Sz = 0), whose ground state lies in k=(0,0) B1 P=+1 and whose fully symmetric
sector A1 lies higher."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import GCNN, RBM, RBMSymm
from runner.diagnostics import sectors
from runner.physics import hamiltonians, spectrum, symmetry
from runner.physics import hilbert as hb

E0, E_A1 = -21.7795008679, -21.3135696181


@pytest.fixture(scope="module")
def kagome():
    hilbert = hb.kagome(2, total_sz=0)
    ham = hamiltonians.heisenberg(hilbert, 1.0, 0.0, "none")
    result = spectrum.spectrum(ham, hilbert)
    return hilbert, ham, result, symmetry.space_group(hilbert)


def _probes(hilbert, n=12, seed=0):
    rng = np.random.default_rng(seed)
    base = np.array([1] * (hilbert.n_sites // 2) + [-1] * (hilbert.n_sites // 2), np.int8)
    return np.stack([rng.permutation(base) for _ in range(n)])


def _reach(model, kagome, seed=0):
    hilbert, _, result, group = kagome
    probes = _probes(hilbert)
    params = model.init(jax.random.PRNGKey(seed), jnp.asarray(probes))["params"]
    # random parameters of every size: no symmetry by accident
    leaves, tree = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(seed + 1), len(leaves))
    params = tree.unflatten([x + 0.3 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)])
    log_psi = jax.jit(lambda s: model.apply({"params": params}, s))
    c_E, flip = sectors.measure(lambda s: log_psi(jnp.asarray(s)), probes, group, flip=True)
    return c_E, flip, sectors.reachable_energy(result, group, c_E, flip)


def test_eigenvalues_are_the_constant_ratios_only():
    log_psi_S = np.log(np.array([1.0, 2.0, 3.0]) + 0j)
    images_SxE = np.stack([log_psi_S, log_psi_S + 1j * np.pi, np.log([1.0, 2.5, 3.0]) + 0j], axis=1)
    c = sectors.eigenvalues(log_psi_S, images_SxE)
    assert c[0] == pytest.approx(1) and c[1] == pytest.approx(-1) and c[2] is None
    # a probe where psi vanishes (by symmetry) is left out rather than spoiling the ratio
    c = sectors.eigenvalues(np.append(log_psi_S, -np.inf), np.vstack([images_SxE, [-np.inf, np.nan, 0]]))
    assert c[0] == pytest.approx(1) and c[1] == pytest.approx(-1)


def test_the_spectrum_of_kagome_2x2(kagome):
    _, _, result, _ = kagome
    levels = {s.name: v[0] for s, v in result.levels.items() if v}
    assert levels["k=(0,0) B1 P=+1"] == pytest.approx(E0, abs=1e-8)
    assert levels["k=(0,0) A1 P=+1"] == pytest.approx(E_A1, abs=1e-8)
    assert min(levels.values()) == pytest.approx(E0, abs=1e-8)


def test_a_model_without_symmetry_reaches_every_state(kagome):
    c_E, flip, reach = _reach(RBM(alpha=1, param_dtype=jnp.complex128), kagome)
    assert flip is None and all(c is None for c in c_E[1:])
    assert reach is None


def test_a_space_group_invariant_model_reaches_only_the_symmetric_sector(kagome):
    hilbert = kagome[0]
    c_E, _, reach = _reach(RBMSymm(alpha=1, group="lattice", param_dtype=jnp.complex128, hilbert=hilbert), kagome)
    assert all(c is not None and c == pytest.approx(1) for c in c_E)
    assert reach == pytest.approx(E_A1, abs=1e-8)
    summary = {"exact_energy": E0, "sector_exact_energy": reach, "sector": None, "exact_sector": "k=(0,0) B1 P=+1"}
    name, message = sectors.check(summary)
    assert name == "sector" and "k=(0,0) B1 P=+1" in message and "-21.31356962" in message


def test_a_model_in_the_ground_state_sector_reaches_it(kagome):
    hilbert = kagome[0]
    sector = {"momentum": [0, 0], "irrep": "B1", "parity": 1}
    c_E, flip, reach = _reach(GCNN(features=[2, 2], sector=sector, param_dtype=jnp.complex128, hilbert=hilbert),
                              kagome)
    assert flip == pytest.approx(1)
    assert reach == pytest.approx(E0, abs=1e-8)
    assert sectors.check({"exact_energy": E0, "sector_exact_energy": reach, "sector": "k=(0,0) B1 P=+1"}) is None


def test_a_model_in_another_sector_is_told_so(kagome):
    hilbert = kagome[0]
    sector = {"momentum": [0, 0], "irrep": "A2", "parity": 1}
    _, _, reach = _reach(GCNN(features=[2, 2], sector=sector, param_dtype=jnp.complex128, hilbert=hilbert), kagome)
    a2 = {s.name: v[0] for s, v in kagome[2].levels.items() if v}["k=(0,0) A2 P=+1"]
    assert reach == pytest.approx(a2, abs=1e-8)
    assert sectors.check({"exact_energy": E0, "sector_exact_energy": reach, "sector": "k=(0,0) A2 P=+1"})[0] == "sector"
