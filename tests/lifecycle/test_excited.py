"""task=excited: a run's levels and gaps against dense diagonalisation, the summary's fields, resume
bit for bit, the same levels on 1 and 4 devices, and per-state variances and exact fields from
local matrices of exact eigenstates."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from runner import app
from runner.config.build import build
from runner.errors import ConfigError
from runner.lifecycle import excited as exc
from runner.parallel import mesh
from runner.physics import hamiltonians, pauli
from runner.physics import hilbert as hb
from tests.helpers.cli import REPO, run_cli
from tests.helpers.config import compose_config
from tests.helpers.runs import EXCITED_H as H
from tests.helpers.runs import EXCITED_K as K
from tests.helpers.runs import EXCITED_L as L
from tests.helpers.runs import EXCITED_TINY as TINY
from tests.helpers.runs import checkpoint_leaves

def dense_levels(n_levels=K):
    space = hb.chain(L)
    dense = pauli.to_sparse(hamiltonians.ising(space, h=H), hb.all_states(space)).toarray()
    return np.linalg.eigvalsh(dense)[:n_levels]


def exact_magnetisation_x(n_levels=K):
    """1/N sum_i <X_i> in each of the lowest eigenvectors (the levels are not degenerate)."""
    space = hb.chain(L)
    states = hb.all_states(space)
    _, vectors = np.linalg.eigh(pauli.to_sparse(hamiltonians.ising(space, h=H), states).toarray())
    x = pauli.to_sparse(pauli.pauli_sum(L, [(1.0 / L, "X", (i,)) for i in range(L)]), states).toarray()
    return [float(v @ x @ v) for v in vectors[:, :n_levels].T]


def run(overrides, run_dir, layout=None):
    """The run of the composed config in run_dir (on `layout`, else one device)."""
    return app.execute(build(compose_config(overrides)), layout or mesh.make_mesh("single"), run_dir)


def metrics(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k != "wall_time"} for line in lines]


def levels_of(summary):
    return [(s["energy"], s["energy_error"], s["variance"]) for s in summary["states"]] + \
        [(g["gap"], g["gap_error"]) for g in summary["gaps"]]


@pytest.mark.slow
def test_the_cli_run_finds_the_lowest_levels(tmp_path):
    """`python -m runner task=excited` on the TFIM chain (L=4, h=1, K=2): each level within 5
    error bars plus 1e-3 relative of dense eigvalsh, the gaps within 5 of their error bars plus 1 %,
    each state's magnetization_x within 5 error bars plus 1e-2 of the eigenvector's,
    the exact fields those of eigvalsh, the checkpoint holding the K states' parameters."""
    run_cli([*TINY, "n_iter=200", "observables=spin", f"hydra.run.dir={tmp_path}"], REPO, check=True, timeout=600)
    summary = json.loads((tmp_path / "summary.json").read_text())
    exact = dense_levels()
    assert summary["task"] == "excited" and summary["status"] == "completed" and summary["n_states"] == K
    np.testing.assert_allclose(summary["exact_levels"], exact, rtol=1e-12)
    energies = np.array([s["energy"] for s in summary["states"]])
    errors = np.array([s["energy_error"] for s in summary["states"]])
    assert np.all(np.diff(energies) > 0) and np.all(errors > 0)
    assert np.all(np.abs(energies - exact) < 5 * errors + 1e-3 * np.abs(exact)), (energies, errors, exact)
    for k, gap in enumerate(summary["gaps"], start=1):
        assert abs(gap["gap"] - (exact[k] - exact[0])) < 5 * gap["gap_error"] + 1e-2 * (exact[k] - exact[0]), gap
        assert gap["exact_gap"] == pytest.approx(exact[k] - exact[0], rel=1e-12)
    for state, e in zip(summary["states"], exact):
        assert state["relative_error"] == pytest.approx(abs(state["energy"] - e) / abs(e))
        assert 0 <= state["variance"] < 0.05 and state["v_score"] >= 0
    assert summary["energy"] == pytest.approx(energies.sum(), abs=1e-9)  # the trace: sum_j H_j's local energy
    assert summary["exact_energy"] == pytest.approx(exact.sum(), rel=1e-12)
    for state, x in zip(summary["states"], exact_magnetisation_x()):  # each eigenstate's <X>, measured in it
        found, error = state["observables"]["magnetization_x"], state["observables"]["magnetization_x_error"]
        assert error > 0 and abs(found - x) < 5 * error + 1e-2, (found, error, x)
    leaves = checkpoint_leaves(tmp_path)
    assert any(v.ndim >= 1 and v.shape[0] == K and np.iscomplexobj(v) for v in leaves.values())
    check_states_span_the_lowest_levels(tmp_path)
    check_evaluation_repeats_the_final_estimate(tmp_path, summary)


def check_evaluation_repeats_the_final_estimate(run_dir, summary):
    """`runner.evaluate` with the run's own settings continues its chains: the same levels, gaps
    and per-state observables as the run's final estimate, bit for bit."""
    from runner import evaluate

    evaluation = evaluate.evaluate(run_dir)
    assert evaluation["states"] == summary["states"] and evaluation["gaps"] == summary["gaps"]
    assert evaluation["peak_check"] is None
    assert json.loads((run_dir / "evaluation.json").read_text())["states"] == summary["states"]


def check_states_span_the_lowest_levels(run_dir):
    """`runner.load(run).state(k)`: eigenstate k, the combination of the K trained states with the
    summary's coefficients (one RBM of alpha 1 per state in its parameters), on the model's own
    chain: weight outside the K lowest eigenvectors below 1 %, its dense energy
    <psi|H|psi>/<psi|psi> and its sampled `expect("energy")` that of summary level k and the exact
    level k (issue 56: it was one copy's function, not the k-th eigenstate)."""
    import runner

    space = hb.chain(L)
    states = hb.all_states(space)
    dense = pauli.to_sparse(hamiltonians.ising(space, h=H), states).toarray()
    exact, vectors = np.linalg.eigh(dense)
    low = vectors[:, :K]
    summary = json.loads((run_dir / "summary.json").read_text())
    trained = runner.load(run_dir)
    for k in range(K):
        state = trained.state(k)
        assert state.hilbert.n_sites == L and state.params["base"]["kernel"].shape == (K, L, L)
        psi = np.exp(np.asarray(state.log_psi(states)))
        psi /= np.linalg.norm(psi)
        assert np.linalg.norm(psi - low @ (low.conj().T @ psi)) ** 2 < 1e-2, k
        level, error = summary["states"][k]["energy"], summary["states"][k]["energy_error"]
        energy = np.vdot(psi, dense @ psi).real
        assert abs(energy - exact[k]) < 1e-3 * abs(exact[k]), (k, energy, exact[k])
        assert abs(energy - level) < 5 * error + 1e-3 * abs(exact[k]), (k, energy, level, error)
        sampled = state.expect("energy")
        assert abs(sampled.mean - exact[k]) < 5 * sampled.error + 1e-3 * abs(exact[k]), (k, sampled, exact[k])
    with pytest.raises(ConfigError, match="0 to 1"):
        trained.state(K)
    path = run_dir / "summary.json"
    text = path.read_text()
    try:  # a summary without the coefficients (an older run): a clear error, not a wrong state
        old = json.loads(text)
        for s in old["states"]:
            del s["coefficients"]
        path.write_text(json.dumps(old))
        with pytest.raises(ConfigError, match="no eigenstate coefficients"):
            trained.state(0)
    finally:
        path.write_text(text)


@pytest.mark.slow
def test_resume_continues_bit_for_bit(tmp_path):
    """A run of 10 steps, killed after writing step 10's metrics record but before anything else,
    extended to 20 steps, gives the metrics, checkpoint and levels of one run of 20 steps bit for bit."""
    common = [*TINY, "exact=false", "checkpoint_every=10"]
    whole = run([*common, "n_iter=20"], tmp_path / "whole")
    run([*common, "n_iter=10"], tmp_path / "parts")
    assert metrics(tmp_path / "parts") == metrics(tmp_path / "whole")[:10]
    (tmp_path / "parts" / "summary.json").unlink()
    with (tmp_path / "parts" / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 10, "energy": 0.0}) + "\n")
    resumed = run([*common, "n_iter=20"], tmp_path / "parts")
    assert metrics(tmp_path / "parts") == metrics(tmp_path / "whole")
    assert levels_of(resumed) == levels_of(whole)
    got, want = checkpoint_leaves(tmp_path / "parts"), checkpoint_leaves(tmp_path / "whole")
    assert got.keys() == want.keys()
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def _eigenstate_matrices(n_chains=4, n_samples=8, seed=0):
    """Local matrices of K states spanning the K lowest eigenstates: C diag(E) C^-1 at every sample
    (what `runner.core.excited.local_matrix` gives for them: tests/core/test_excited.py)."""
    exact = dense_levels()
    rng = np.random.default_rng(seed)
    c = rng.normal(size=(K, K)) + 1j * rng.normal(size=(K, K))
    m = c @ np.diag(exact) @ np.linalg.inv(c)
    return np.broadcast_to(m, (n_chains, n_samples, K, K)), exact


def test_level_fields_of_exact_eigenstates_have_zero_variance_and_the_exact_levels():
    m, exact = _eigenstate_matrices()
    fields = exc.level_fields(m, L, list(exact))
    assert [s["energy"] for s in fields["states"]] == pytest.approx(exact, abs=1e-10)
    assert all(s["variance"] < 1e-20 and s["relative_error"] < 1e-10 for s in fields["states"])
    assert [g["gap"] for g in fields["gaps"]] == pytest.approx(exact[1:] - exact[0], abs=1e-10)
    assert fields["exact_levels"] == list(exact)
    assert exc.with_exact(fields, None)["exact_levels"] is None


def test_exact_levels_are_those_of_the_model_sector():
    """With a model that projects onto a sector, the exact levels are that sector's lowest (dense
    projector of tests/physics/test_spectrum.py), not the space's; without one, the space's."""
    from runner.physics import spectrum

    sector = "model.sector={momentum: [0], irrep: \"A'\", parity: -1}"
    experiment = build(compose_config([*TINY, "hilbert.L=6", "model=rbm_symm", sector]))
    levels = spectrum.spectrum(experiment.hamiltonian, experiment.hilbert, n_levels=K, parity=True).levels
    assert exc.exact_levels(experiment) == pytest.approx(levels[experiment.sector], abs=1e-10)
    space = hb.chain(6)
    dense = np.linalg.eigvalsh(pauli.to_sparse(hamiltonians.ising(space, h=H), hb.all_states(space)).toarray())
    assert exc.exact_levels(build(compose_config([*TINY, "hilbert.L=6"]))) == pytest.approx(dense[:K], abs=1e-10)
    assert exc.exact_levels(build(compose_config([*TINY, "exact=false"]))) is None


def _invariant_levels_dense(space, ham, perms, n_levels):
    """The lowest levels of H on the states invariant under the site permutations `perms`, from an
    orthonormal basis of group-averaged basis vectors (dense)."""
    states = hb.all_states(space)
    index = {tuple(s): i for i, s in enumerate(states.tolist())}
    average = np.zeros((len(states), len(states)))
    for perm in perms:
        average[[index[tuple(s)] for s in states[:, perm].tolist()], np.arange(len(states))] += 1 / len(perms)
    u, sv, _ = np.linalg.svd(average)
    basis = u[:, sv > 1e-9]
    dense = pauli.to_sparse(ham, states).toarray()
    return np.linalg.eigvalsh(basis.T @ dense @ basis)[:n_levels]


def test_exact_levels_are_those_of_the_space_the_model_symmetry_spans():
    """A model invariant by weight sharing (rbm_symm over the chain's space group, no sector) spans
    only the invariant states: the exact levels are measured from it and are theirs, not the
    space's (whose third level at h=2 lies at momentum pi, out of the model's reach)."""
    from runner.core.vmc import init_state
    from runner.physics import symmetry

    n, k, h = 6, 3, 2.0
    overrides = [o for o in TINY if not o.startswith(("hamiltonian.h", "task.n_states"))]
    overrides += [f"hilbert.L={n}", f"hamiltonian.h={h}", f"task.n_states={k}"]
    space = hb.chain(n)
    ham = hamiltonians.ising(space, h=h)
    dense = np.linalg.eigvalsh(pauli.to_sparse(ham, hb.all_states(space)).toarray())
    for model, invariant in ((["model=rbm_symm", "model.group=lattice"], True), ([], False)):
        experiment = build(compose_config([*overrides, *model]))
        state = init_state(experiment.problem, 0, jnp.ones((k * n,), jnp.int8))
        rows, parity = exc.measured_invariance(experiment, state)
        assert parity is None  # the visible bias is odd under the flip
        group = symmetry.space_group(experiment.hilbert)
        if invariant:
            assert {tuple(r) for r in rows.tolist()} == {tuple(r) for r in group.perm_ExN.tolist()}
            want = _invariant_levels_dense(space, ham, group.perm_ExN, k)
            assert want[2] > dense[2] + 1e-3  # the check means something: the space's levels differ
        else:
            assert len(rows) == 1  # a plain RBM: the identity alone
            want = dense[:k]
        assert exc.exact_levels(experiment, (rows, parity)) == pytest.approx(want, abs=1e-10)


def test_an_unconverged_gap_or_a_falling_trace_gets_one_warning():
    """`convergence_warning` (issue 56): a gap 16 error bars from its exact value (the README
    recipe's E_2 - E_0 = 2.5027(15) against 2.4786) and a trace still falling over the last tenth
    each name themselves in one `excited_unconverged` warning; levels within their error bars and
    a flat trace give none; unknown error bars (one chain) or exact values are not judged."""
    flat = [{"step": i, "energy": -10.0 + 0.01 * (-1) ** i} for i in range(200)]
    falling = [{"step": i, "energy": -10.0 - 0.01 * i} for i in range(200)]
    good = {"states": [{"energy": -7.0, "energy_error": 1e-3, "exact_energy": -7.001},
                       {"energy": -4.5, "energy_error": 1e-3, "exact_energy": -4.5}],
            "gaps": [{"gap": 2.5, "gap_error": 1e-3, "exact_gap": 2.501}]}
    assert exc.convergence_warning(good, flat) is None
    bad = {"states": good["states"], "gaps": [{"gap": 2.5027, "gap_error": 0.0015, "exact_gap": 2.4786}]}
    warning = exc.convergence_warning(bad, flat)
    assert warning["name"] == "excited_unconverged" and "E_1 - E_0 2.502700" in warning["message"]
    assert "16 error bars" in warning["message"] and "falls" not in warning["message"]
    warning = exc.convergence_warning(good, falling)
    assert warning["name"] == "excited_unconverged" and "still falls over the last tenth" in warning["message"]
    unknown = {"states": [{"energy": -7.0, "energy_error": None, "exact_energy": -8.0}],
               "gaps": [{"gap": 2.0, "gap_error": 1e-3}]}
    assert exc.convergence_warning(unknown, flat) is None
