"""The full-sum sampler: exact sums over the space (or its symmetry orbits) against dense
references, the same bits on every layout, and the refusals that keep an orbit sum honest."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from models import RBM, RBMSymm
from runner import app
from runner.config.build import build
from runner.core import precond
from runner.core import sampler as smp
from runner.core.full_sum import orbits
from runner.core.problem import Problem
from runner.core.vmc import full_sum_invariance_error, init_state
from runner.core.wavefunction import from_split, gradient_mode
from runner.errors import ConfigError
from runner.parallel import mesh
from runner.physics import exact, hamiltonians, pauli
from runner.physics import hilbert as hb
from tests.helpers.cli import REPO, evaluated, run_cli
from tests.helpers.config import compose_config
from tests.helpers.exact import exact_setup, exact_weighted
from tests.helpers.parallel import free_port, start_distributed
from tests.helpers.runs import assert_identical_runs, energies
from tests.helpers.steps import full_sum_step

SHIFT = 0.05
PRECONDITIONERS = {
    "sr": precond.sr(diag_shift=SHIFT, solver="cholesky"),
    "cg": precond.sr(diag_shift=SHIFT, solver="cg", cg_tol=1e-12, cg_maxiter=2000),
    "minsr": precond.minsr(diag_shift=SHIFT),
}


def _update(problem, params, chunk_size=None):
    """(energy stats, flat update) of one full-sum step, jitted."""
    return full_sum_step(dataclasses.replace(problem, chunk_size=chunk_size), params)


# Every model with the direct solvers, chunked and not; CG (slow to compile) on two of them.
CASES = [(m, solver, chunk) for m in ("rbm_real", "rbm_complex", "nonholomorphic") for solver in ("sr", "minsr")
         for chunk in (None, 6)] + [("rbm_complex", "cg", None), ("nonholomorphic", "cg", 6)]


@pytest.mark.parametrize("model_name,solver,chunk_size", CASES)
@pytest.mark.slow
def test_energy_and_update_are_the_exact_sums(model_name, solver, chunk_size):
    """64 configurations on 3 rows of 22 (2 padding rows of weight 0): the energy, its variance
    and the SR / minSR update equal the dense sums over the space, chunked or not."""
    lattice, ham, model, states, params, H = exact_setup(model_name, seed=1)
    sampler = smp.full_sum(lattice, n_chains=3)
    assert sampler.sigma_CxTxN.shape[:2] == (3, 22) and sampler.n_configurations == 64
    problem = Problem(ham, model, sampler, optax.sgd(0.1), PRECONDITIONERS[solver])
    mode = gradient_mode(params, model)
    core_mode = "real" if mode == "split" else mode
    Obar, eps, E = (np.asarray(x) for x in exact_weighted(problem, params, states, mode))
    psi = np.exp(np.asarray(model.apply({"params": params}, states)))
    p = np.abs(psi) ** 2 / np.sum(np.abs(psi) ** 2)
    eloc = eps / np.sqrt(p) + E
    if core_mode == "real":
        S, F = (Obar.conj().T @ Obar).real, 2 * (Obar.conj().T @ eps).real
    else:
        S, F = Obar.conj().T @ Obar, 2 * (Obar.conj().T @ eps)
    expected = np.linalg.solve(S + SHIFT * np.eye(len(S)), F)
    if mode == "split":
        expected = np.asarray(from_split(jnp.asarray(expected)))

    stats, update = _update(problem, params, chunk_size)
    np.testing.assert_allclose(stats.mean, np.vdot(psi, H @ psi) / np.vdot(psi, psi), rtol=1e-10)
    np.testing.assert_allclose(stats.variance, np.sum(p * np.abs(eloc - E) ** 2), rtol=1e-8)
    assert stats.error_of_mean == 0 and stats.tau_corr == 0
    np.testing.assert_allclose(np.asarray(update), expected, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("lattice,symmetry,n_orbits", [
    (hb.chain(10, total_sz=0), "lattice", 16),
    (hb.square(Lx=2, Ly=4, total_sz=0), "translations", 12),
])
@pytest.mark.slow
def test_the_sum_over_orbits_equals_the_sum_over_all_configurations(lattice, symmetry, n_orbits):
    """A space-group RBM on the Marshall-rotated J1-J2 model: one configuration per orbit,
    weighted by the orbit's size, gives the energy and the SR update of all 252 (70)."""
    ham = hamiltonians.heisenberg(lattice, 1.0, 0.5, "marshall")
    model = RBMSymm(alpha=2, group="lattice" if symmetry == "lattice" else "translations",
                    param_dtype=jnp.complex128, hilbert=lattice)
    params = model.init(jax.random.PRNGKey(3), jnp.ones(lattice.n_sites, jnp.int8))["params"]
    params = jax.tree_util.tree_map(lambda x: 10 * x, params)  # far from uniform
    out = {}
    for sym in (symmetry, "none"):
        sampler = smp.full_sum(lattice, n_chains=4, symmetry=sym)
        problem = Problem(ham, model, sampler, optax.sgd(0.1), PRECONDITIONERS["sr"])
        assert full_sum_invariance_error(problem, [params]) is None
        out[sym] = (sampler.n_configurations, *_update(problem, params))
    assert out[symmetry][0] == n_orbits and out["none"][0] == lattice.n_states
    np.testing.assert_allclose(out[symmetry][1].mean, out["none"][1].mean, rtol=1e-12)
    np.testing.assert_allclose(out[symmetry][1].variance, out["none"][1].variance, rtol=1e-10)
    np.testing.assert_allclose(out[symmetry][2], out["none"][2], rtol=1e-8, atol=1e-10)
    psi = np.exp(np.asarray(model.apply({"params": params}, jnp.asarray(hb.all_states(lattice)))))
    np.testing.assert_allclose(out[symmetry][1].mean, exact.energy_of(ham, lattice, psi), rtol=1e-12)


@pytest.mark.slow
def test_an_orbit_sum_over_a_sector_with_vanishing_orbits_is_the_whole_sum():
    """A projection onto a sector odd under the reflection is exactly zero on the reflection-symmetric
    configurations: the invariance check passes over them, and the sum over translation orbits
    still equals the sum over every configuration and the dense energy."""
    lattice = hb.chain(8, total_sz=0)
    ham = hamiltonians.heisenberg(lattice, 1.0, 0.5, "marshall")
    model = RBMSymm(alpha=2, group="translations", param_dtype=jnp.complex128, hilbert=lattice,
                    sector={"momentum": [0], "irrep": "A''", "parity": -1})
    params = model.init(jax.random.PRNGKey(3), jnp.ones(lattice.n_sites, jnp.int8))["params"]
    states = jnp.asarray(hb.all_states(lattice))
    log_psi = np.asarray(model.apply({"params": params}, states))
    assert np.sum(np.exp(log_psi.real) < 1e-12) > 0  # some configurations vanish by symmetry
    out = {}
    for sym in ("translations", "none"):
        problem = Problem(ham, model, smp.full_sum(lattice, n_chains=4, symmetry=sym), optax.sgd(0.1),
                          PRECONDITIONERS["sr"])
        assert full_sum_invariance_error(problem, [params]) is None
        out[sym] = _update(problem, params)
    psi = np.exp(log_psi)  # the projection's cancellation leaves |psi| ~ 1e-11 of the largest, not 0
    np.testing.assert_allclose(out["translations"][0].mean, exact.energy_of(ham, lattice, psi), rtol=1e-9)
    np.testing.assert_allclose(out["none"][0].mean, out["translations"][0].mean, rtol=1e-9)
    np.testing.assert_allclose(out["translations"][1], out["none"][1], rtol=1e-8, atol=1e-10)


def test_orbits_cover_the_space_once():
    lattice = hb.square(4, total_sz=0)
    states = hb.all_states(lattice)
    reps, sizes = orbits(states, np.asarray(lattice.space_group))
    assert len(reps) == 153 and sizes.sum() == len(states) == 12870
    images = {tuple(s) for r in reps for s in np.asarray(r)[np.asarray(lattice.space_group)]}
    assert len(images) == 12870  # every configuration is an image of exactly one representative


def test_an_orbit_sum_refuses_what_is_not_invariant():
    lattice = hb.chain(8, total_sz=0)
    ham = hamiltonians.heisenberg(lattice, 1.0, 0.0, "marshall")
    sampler = smp.full_sum(lattice, n_chains=4, symmetry="translations")
    problem = Problem(ham, RBM(alpha=1, param_dtype=jnp.complex128), sampler, optax.sgd(0.1), precond.sr())
    params = problem.model.init(jax.random.PRNGKey(0), jnp.ones(8, jnp.int8))["params"]
    error = full_sum_invariance_error(problem, [params])
    assert error.startswith("translations needs a model invariant under the group"), error
    # A field on one site breaks the translations.
    field = hamiltonians.pauli(lattice, [{"coeff": 1.0, "ops": "ZZ", "on": "bonds"}, {"coeff": 0.3, "ops": "Z", "on": [[0]]}])
    assert pauli.not_invariant_under(field, lattice.translations) == 1
    assert pauli.not_invariant_under(ham, np.asarray(lattice.space_group)) is None
    with pytest.raises(ConfigError, match="must be one of none, translations, lattice"):
        smp.full_sum(lattice, symmetry="point")
    with pytest.raises(ConfigError, match="at most 65536 states"):
        smp.full_sum(hb.chain(20))


@pytest.mark.parametrize("override,key", [
    (["clip_local_energy=5"], "clip_local_energy"),
    (["preconditioner=minsr", "preconditioner.momentum=0.9"], "preconditioner.momentum"),
    (["hamiltonian=pauli", "model=rbm_symm", "sampler.symmetry=translations"], "sampler.symmetry"),
])
def test_full_sum_refuses_at_build(override, key):
    config = compose_config(["hilbert.L=6", "sampler=full_sum", *override])
    if key == "sampler.symmetry":  # a field on site 0 breaks the translations
        config["hamiltonian"]["terms"].append({"coeff": 0.3, "ops": "Z", "on": [[0]]})
    with pytest.raises(ConfigError) as err:
        build(config)
    assert err.value.key == key


def _observed(run_dir):
    """The observables of metrics.jsonl: {step: {obs field: value}} for the steps that measured."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: {k: v for k, v in r.items() if k.startswith("obs")} for r in records
            if any(k.startswith("obs/") for k in r)}


@pytest.mark.slow
def test_a_run_is_exact_and_identical_on_every_layout(tmp_path):
    """J1-J2 on a 10-site chain over the space group's orbits: each step's energy is the exact
    energy of its parameters (so the final one is the dense <psi|H|psi> of the saved state), with
    error 0; 1, 2 and 4 devices and 2 processes give the same bits, the observables measured
    during training (over every configuration) included."""
    overrides = ["hilbert.L=10", "hilbert.total_sz=0", "hamiltonian=heisenberg", "hamiltonian.J2=0.5",
                 "hamiltonian.phase_prior=marshall", "model=rbm_symm", "model.group=lattice", "dtype=complex128",
                 "sampler=full_sum", "sampler.symmetry=lattice", "sampler.n_chains=4", "n_iter=6", "exact=true",
                 "checkpoint_every=1000", "observables=spin", "observables.every=2"]
    experiment = build(compose_config(overrides))
    run_cli([*overrides, f"hydra.run.dir={tmp_path / 'devices1'}"], REPO, check=True)
    devices = jax.devices()
    for n in (2, 4):
        layout = mesh.Layout(jax.sharding.Mesh(np.asarray(devices[:n]), (mesh.CHAIN_AXIS,)))
        summary = app.execute(experiment, layout, tmp_path / f"devices{n}")
        assert summary["energy_error"] == 0 and summary["n_samples"] == 16  # 16 orbits on 4 rows of 4
        assert_identical_runs(tmp_path / f"devices{n}", tmp_path / "devices1")
        assert _observed(tmp_path / f"devices{n}") == _observed(tmp_path / "devices1")
    procs = start_distributed(overrides, tmp_path / "processes2", free_port(), devices=1)
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert_identical_runs(tmp_path / "processes2", tmp_path / "devices1")
    observed = _observed(tmp_path / "devices1")
    assert sorted(observed) == [0, 2, 4] and all(v["obs_error/zz_nn"] == 0 for v in observed.values())
    assert _observed(tmp_path / "processes2") == observed

    from runner.api import load

    trained = load(tmp_path / "devices1")
    lattice = experiment.hilbert
    psi = np.exp(np.asarray(trained.log_psi(hb.all_states(lattice))))
    dense = exact.energy_of(experiment.hamiltonian, lattice, psi)
    assert summary["energy"] == pytest.approx(dense, rel=1e-12)
    assert summary["relative_error"] == pytest.approx(abs(dense - summary["exact_energy"]) / abs(summary["exact_energy"]))
    assert energies(tmp_path / "devices1")[-1] > summary["energy"]  # the last step still lowered it
    result = evaluated(tmp_path / "devices1", ["final_rounds=3"])  # rounds would repeat the sum: one
    assert result["energy"] == pytest.approx(dense, rel=1e-12) and result["energy_error"] == 0


def test_an_orbit_sum_with_a_model_that_is_not_symmetric_exits_2(tmp_path):
    result = run_cli(["hilbert.L=8", "hilbert.total_sz=0", "hamiltonian=heisenberg", "sampler=full_sum",
                      "sampler.symmetry=translations", "n_iter=2", f"hydra.run.dir={tmp_path}"], REPO)
    assert result.returncode == 2
    assert "Config error: sampler.symmetry translations needs a model invariant under the group" in result.stderr
    assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.slow
def test_observables_are_exact_sums_over_every_configuration(tmp_path):
    """With orbits the energy is summed over them, but the observables over every configuration
    (Z_i Z_j differs between members of an orbit): <Z_i Z_j>, zz_nn and S(q) equal the dense sums
    over the saved state's |psi|^2, with error 0, in the summary, correlations.json and
    runner.load(...).expect; during training (`observables.every`) they equal the dense sums over
    the parameters of their step (step 0: the initial ones), with error 0."""
    overrides = ["hilbert.L=10", "hilbert.total_sz=0", "hamiltonian=heisenberg", "hamiltonian.J2=0.5",
                 "hamiltonian.phase_prior=marshall", "model=rbm_symm", "model.group=lattice", "dtype=complex128",
                 "sampler=full_sum", "sampler.symmetry=lattice", "sampler.n_chains=4", "observables=spin",
                 "observables.every=3", "n_iter=4"]
    run_cli([*overrides, f"hydra.run.dir={tmp_path}"], REPO, check=True)
    from runner.api import load

    trained = load(tmp_path)
    states = hb.all_states(trained.hilbert)
    p = np.abs(np.exp(np.asarray(trained.log_psi(states)))) ** 2
    p /= p.sum()
    s = states.astype(np.float64)
    zz = np.einsum("d,di,dj->ij", p, s, s)
    summary = json.loads((tmp_path / "summary.json").read_text())
    correlations = json.loads((tmp_path / "correlations.json").read_text())
    np.testing.assert_allclose(correlations["zz"], zz, atol=1e-12)
    assert np.all(np.asarray(correlations["zz_error"]) == 0)
    bonds = np.asarray(trained.hilbert.bonds)
    zz_nn = zz[bonds[:, 0], bonds[:, 1]].mean()
    assert summary["observables"]["zz_nn"] == {"mean": pytest.approx(zz_nn, abs=1e-12), "error": 0.0}
    cos_QxN, sin_QxN = np.cos(np.asarray(correlations["momenta"]) @ np.asarray(correlations["positions"]).T), \
        np.sin(np.asarray(correlations["momenta"]) @ np.asarray(correlations["positions"]).T)
    sq = np.einsum("d,qd->q", p, ((s @ cos_QxN.T) ** 2 + (s @ sin_QxN.T) ** 2).T) / trained.hilbert.n_sites
    np.testing.assert_allclose(correlations["structure_factor"], sq, atol=1e-12)
    assert summary["observables"]["structure_factor_zz"]["mean"] == pytest.approx(sq.max(), abs=1e-12)
    assert trained.expect("zz_nn") == (pytest.approx(zz_nn, abs=1e-12), 0.0)
    problem = build(compose_config(overrides)).problem
    initial = init_state(problem, 0, jnp.ones(10, jnp.int8)).params
    p0 = np.abs(np.exp(np.asarray(problem.logpsi(initial, states)))) ** 2
    p0 /= p0.sum()
    zz0 = np.einsum("d,di,dj->ij", p0, s, s)
    sq0 = (np.einsum("qi,ij,qj->q", cos_QxN, zz0, cos_QxN) + np.einsum("qi,ij,qj->q", sin_QxN, zz0, sin_QxN)) / 10
    observed = _observed(tmp_path)
    assert sorted(observed) == [0, 3]
    assert observed[0]["obs/zz_nn"] == pytest.approx(zz0[bonds[:, 0], bonds[:, 1]].mean(), abs=1e-12)
    assert observed[0]["obs/structure_factor_zz"] == pytest.approx(sq0.max(), abs=1e-12)
    assert observed[3]["obs/zz_nn"] != observed[0]["obs/zz_nn"]  # step 3 measured its own parameters
    assert all(v[f"obs_error/{name}"] == 0 for v in observed.values() for name in ("zz_nn", "xx_nn", "mz2"))
    assert trained.expect("energy") == (pytest.approx(summary["energy"], rel=1e-12), 0.0)
    with pytest.raises(ValueError, match="draws no samples"):
        trained.sample(16)
