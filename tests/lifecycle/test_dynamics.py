"""task=dynamics: a quench against exact dynamics from Kronecker products, resume bit for bit, the
same numbers on 1 and 4 devices, one trace of the time derivative per run, the plus_x check."""

import json
import time
from types import SimpleNamespace

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

from models import Jastrow
from runner import api, app, evaluate
from runner.config.build import build, instantiate
from runner.config.task import read
from runner.core import precond
from runner.core import sampler as smp
from runner.core.problem import Problem
from runner.diagnostics import health
from runner.errors import ConfigError
from runner.lifecycle import checkpoint, load, loop
from runner.lifecycle import dynamics as dyn
from runner.parallel import mesh
from runner.physics import hamiltonians
from runner.physics import hilbert as hb
from tests.helpers.cli import REPO, run_cli
from tests.helpers.config import compose_config
from tests.helpers.dense import X, Y, Z, basis_index, dense_ising, site_op
from tests.helpers.runs import QUENCH, StopAfterSaved, assert_same_run, trajectory
from tests.helpers.runs import QUENCH_H as H_QUENCH
from tests.helpers.runs import QUENCH_N as N
from tests.helpers.runs import QUENCH_OBSERVABLES as OBSERVABLES
from tests.helpers.runs import QUENCH_SAMPLED as SAMPLED

def run(overrides, run_dir, layout=None):
    """The run of the composed config in run_dir (on `layout`, else one device)."""
    experiment = build(compose_config(overrides))
    layout = layout or mesh.make_mesh("single")
    return app.execute(experiment, layout, run_dir)


def exact_quench(times):
    """(M_x, sum_bonds Y_i Z_j) at `times` from |+x>^N under the dense TFIM, by scipy's expm."""
    bonds = hb.chain(N).bonds
    H = dense_ising(bonds, N, 1.0, H_QUENCH)
    mx = sum(site_op(X, i, N) for i in range(N)) / N
    yz = sum(site_op(Y, i, N) @ site_op(Z, j, N) for i, j in bonds)
    psi0 = np.ones(2**N, complex) / 2 ** (N / 2)
    out = []
    for t in times:
        psi = scipy.linalg.expm(-1j * H * t) @ psi0
        out.append([np.vdot(psi, mx @ psi).real, np.vdot(psi, yz @ psi).real])
    return np.array(out).T


@pytest.mark.slow
def test_quench_follows_exact_dynamics(tmp_path):
    """TFIM chain from plus_x (every Jastrow coupling zero) quenched to h = 0.5, full sum, rk4:
    M_x, the Y Z correlator and the energy follow exp(-i H t) to t = 0.5 (M_x falls from 1 to
    0.34; the correlator reaches -2.7), and the run's own exact trajectory agrees."""
    summary = run([*QUENCH, "sampler=full_sum", "task.t_end=0.5", "task/integrator=rk4", "task.integrator.dt=0.01"], tmp_path)
    records = trajectory(tmp_path)
    t = np.array([r["t"] for r in records])
    np.testing.assert_allclose(t, [0.0, 0.1, 0.2, 0.3, 0.4, 0.5], atol=1e-12)
    mx, yz = exact_quench(t)
    ours_mx, ours_yz = np.array([r["obs/mx"] for r in records]), np.array([r["obs/yz"] for r in records])
    assert np.max(np.abs(ours_mx - mx)) < 1e-3
    assert np.max(np.abs(ours_yz - yz)) < 2e-2
    assert np.max(np.abs(ours_yz + yz)) > 1.0  # time running backwards would fail the line above
    assert max(abs(r["energy"] + H_QUENCH * N) for r in records) < 1e-6  # <H> = -h N is conserved
    assert records[0]["residual"] == 0.0 and 0 < records[-1]["residual"] < 0.1
    assert summary["task"] == "dynamics" and summary["status"] == "completed" and summary["t_reached"] == 0.5
    assert summary["max_abs_error"]["obs/mx"] < 1e-3 and summary["max_abs_error"]["energy"] < 1e-6
    assert summary["warnings"] == health.check_dynamics(records, real_time=True, metropolis=False)
    assert "energy_drift" not in [w["name"] for w in summary["warnings"]]
    exact = json.loads((tmp_path / "exact_trajectory.json").read_text())
    np.testing.assert_allclose(exact["obs/mx"], mx, atol=1e-10)
    np.testing.assert_allclose(exact["obs/yz"], yz, atol=1e-10)
    assert (tmp_path / "dynamics.png").stat().st_size > 0


@pytest.mark.slow
def test_init_from_evolves_the_trained_state(tmp_path):
    """A short ground-state run at h = 0.5, then a quench to h = 1 from its parameters: the energy
    at t = 0 is <psi|H(h=1)|psi> of the trained state (dense sum), M_x follows the exact dynamics
    of that state (dense expm), and the run's own exact trajectory is that one."""
    common = [f"hilbert.L={N}", "model=jastrow", "dtype=complex128", "sampler=full_sum"]
    run_cli([*common, "hamiltonian.h=0.5", "n_iter=20", "final_rounds=1", f"hydra.run.dir={tmp_path / 'trained'}"],
            REPO, check=True)
    run_cli([*common, "hamiltonian.h=1.0", "task=dynamics", "task.save_every=0.1", "task.t_end=0.3",
             "task.initial_state=init_from", f"init_from={tmp_path / 'trained'}", *OBSERVABLES,
             f"hydra.run.dir={tmp_path / 'quench'}"], REPO, check=True)
    summary = json.loads((tmp_path / "quench" / "summary.json").read_text())
    params = load.load(tmp_path / "trained").state.params
    states = hb.all_states(hb.chain(N))
    psi = np.zeros(2**N, complex)
    psi[basis_index(states)] = np.exp(np.asarray(Jastrow(param_dtype=jnp.complex128).apply({"params": params},
                                                                                          jnp.asarray(states))))
    psi /= np.linalg.norm(psi)
    H = dense_ising(hb.chain(N).bonds, N, 1.0, 1.0)
    mx_op = sum(site_op(X, i, N) for i in range(N)) / N
    records = trajectory(tmp_path / "quench")
    assert abs(records[0]["energy"] - np.vdot(psi, H @ psi).real) < 1e-10
    mx = [np.vdot(p, mx_op @ p).real for p in (scipy.linalg.expm(-1j * H * r["t"]) @ psi for r in records)]
    ours = np.array([r["obs/mx"] for r in records])
    assert abs(ours[0] - mx[0]) < 1e-12  # the trained state itself
    assert np.max(np.abs(ours - mx)) < 1e-2 and mx[-1] - mx[0] > 0.1  # (the Jastrow drifts by 8e-3 at t = 0.3)
    assert abs(summary["max_abs_error"]["obs/mx"] - np.max(np.abs(ours - mx))) < 1e-10


@pytest.mark.slow
def test_resume_continues_bit_for_bit_and_compiles_once(tmp_path, monkeypatch):
    """A run to t = 0.2, killed after writing the record at t = 0.3 but before its checkpoint,
    continued to t = 0.4, gives the trajectory and final checkpoint of one run to t = 0.4 bit for
    bit: sampled chains, adaptive rk23. Over the whole run, the time derivative is traced
    once for the start (FSAL's first stage) and once per further stage of the step (inside the
    compiled advance): nothing is compiled per step or per saved time."""
    traces = []
    original = dyn.time_derivative

    def counting(problem, equation):
        f = original(problem, equation)

        def traced(t, params, chains):
            traces.append(t)
            return f(t, params, chains)

        return traced

    monkeypatch.setattr(dyn, "time_derivative", counting)
    whole = run([*SAMPLED, "task.t_end=0.4"], tmp_path / "whole")
    assert whole["n_steps"] >= 5 and len(traces) == 1 + 3
    run([*SAMPLED, "task.t_end=0.2"], tmp_path / "parts")
    assert trajectory(tmp_path / "parts") == trajectory(tmp_path / "whole")[:3]
    # as if killed while going on: the record at t = 0.3 written, its checkpoint not, no summary
    (tmp_path / "parts" / "summary.json").unlink()
    with (tmp_path / "parts" / "trajectory.jsonl").open("a") as f:
        f.write(json.dumps({"t": 0.3, "energy": 0.0}) + "\n")
    summary = run([*SAMPLED, "task.t_end=0.4"], tmp_path / "parts")
    assert summary["t_reached"] == 0.4 and summary["n_saved"] == 5
    assert_same_run(tmp_path / "parts", tmp_path / "whole")


@pytest.mark.slow
def test_a_stop_between_saved_times_checkpoints_there_and_resumes_bit_for_bit(tmp_path, monkeypatch):
    """The advance to a saved time runs in calls of STEPS_PER_CALL steps with a look for a stop
    signal between them. Stopped after the first record at t = 0.1 (its look), then two calls of one
    step each, the run checkpoints the state it reached, between t = 0.1 and 0.2, exits 3, and
    resumed it gives the trajectory and final checkpoint of one run in calls of 16 steps bit for bit."""
    overrides = [*SAMPLED, "task.t_end=0.3", "task.integrator.dt_max=0.02"]  # five steps or more between saved times
    run(overrides, tmp_path / "whole")
    monkeypatch.setattr(dyn, "STEPS_PER_CALL", 1)
    experiment = build(compose_config(overrides))
    (tmp_path / "parts").mkdir()
    stop = StopAfterSaved(tmp_path / "parts", index=1, looks=3)
    stopped = loop.run(dyn.TASK, experiment, mesh.make_mesh("single"), tmp_path / "parts", False, stop=stop,
                       started=time.perf_counter())
    assert stopped["status"] == "preempted" and stop.saved == 1
    meta = checkpoint.read_meta(tmp_path / "parts" / "checkpoint")
    assert meta["step"] == 1 and 0.1 < meta["t"] < 0.2, meta
    assert [r["t"] for r in trajectory(tmp_path / "parts")] == [0.0, 0.1]
    summary = json.loads((tmp_path / "parts" / "summary.json").read_text())
    assert summary["status"] == "preempted" and "between saved times" in summary["reason"]
    run(overrides, tmp_path / "parts")
    assert_same_run(tmp_path / "parts", tmp_path / "whole")


@pytest.mark.slow
def test_load_and_evaluate_read_the_state_at_the_last_saved_time(tmp_path):
    """`runner.load` and `runner.evaluate` on a sampled quench stopped at t = 0.2: the parameters
    are the dynamics checkpoint's, `t` its saved time, and the state is the evolved one: the
    evaluated energy and M_x agree with the trajectory's last record within error bars and with a
    dense sum over the loaded psi, whose M_x has left its t = 0 value 1."""
    started_from_a_run = compose_config([*QUENCH, "task.initial_state=init_from", f"init_from={tmp_path}"])
    assert load.experiment_of(started_from_a_run).settings.init_from is None  # its own checkpoint holds the state
    run_dir = tmp_path / "quench"
    overrides = [*QUENCH, "sampler=metropolis_local", "sampler.n_samples=512", "sampler.n_chains=8",
                 "task/integrator=rk4", "task.integrator.dt=0.02", "task.t_end=0.2", "exact=false"]
    run_cli([*overrides, f"hydra.run.dir={run_dir}"], REPO, check=True)
    last = trajectory(run_dir)[-1]
    trained = api.load(run_dir)
    assert trained.t == last["t"] == 0.2 and trained.step == 2 and "t=0.2" in repr(trained)
    saved, meta = checkpoint.load(run_dir / "checkpoint", load.state_like(trained_experiment(run_dir)))
    assert meta["t"] == 0.2 and float(saved.integrator.t) == 0.2
    for got, want in zip(jax.tree_util.tree_leaves(trained.params), jax.tree_util.tree_leaves(saved.params)):
        np.testing.assert_array_equal(np.asarray(got), want)
    states = hb.all_states(hb.chain(N))
    psi = np.zeros(2**N, complex)
    psi[basis_index(states)] = np.exp(np.asarray(trained.log_psi(jnp.asarray(states))))
    psi /= np.linalg.norm(psi)
    H = dense_ising(hb.chain(N).bonds, N, 1.0, H_QUENCH)
    mx = np.vdot(psi, sum(site_op(X, i, N) for i in range(N)) @ psi).real / N
    energy = np.vdot(psi, H @ psi).real
    assert mx < 0.95
    result = evaluate.evaluate(run_dir, ["sampler.n_samples=4096", "peak_search=0"])
    assert result["t"] == 0.2 and result["chains"] == "checkpoint"
    for ours, error, key in ((result["energy"], result["energy_error"], "energy"),
                             (result["observables"]["mx"]["mean"], result["observables"]["mx"]["error"], "obs/mx")):
        exact = energy if key == "energy" else mx
        assert abs(ours - last[key]) < 4 * np.hypot(error, last[f"{key}_error"]), key
        assert abs(ours - exact) < 4 * error, key


def trained_experiment(run_dir):
    return load.experiment_of(load.read_config(run_dir))


@pytest.mark.slow
def test_measure_rounds_join_consecutive_draws():
    """measure_rounds = 4: the chains end where four single draws leave them, the energy and M_x
    are the means over the four draws' samples, agree with the dense values within error bars,
    and their error bars are about half of one draw's."""
    experiment = build(compose_config([*SAMPLED, "sampler.n_samples=256"]))
    problem, obs, task = experiment.problem, experiment.observables, experiment.settings.task
    params = jax.tree_util.tree_map(lambda x: 0.3 * jnp.ones_like(x) * (1 + 1j), dyn._plus_x_params(problem, 0))
    chains = smp.init_chains(problem.sampler, 0)
    measure = jax.jit(lambda c, rounds: dyn.measure(problem, task.equation, obs, params, c, rounds), static_argnums=1)
    joined, metrics = measure(chains, 4)
    single, parts = chains, []
    for _ in range(4):
        single, m = measure(single, 1)
        parts.append(m)
    np.testing.assert_array_equal(joined.sigma_CxN, single.sigma_CxN)
    for key in ("energy", "obs/mx"):
        np.testing.assert_allclose(metrics[key], np.mean([m[key] for m in parts]), rtol=1e-12)
        assert 0.3 < metrics[f"{key}_error"] / np.mean([m[f"{key}_error"] for m in parts]) < 0.8
    states = hb.all_states(hb.chain(N))
    psi = np.zeros(2**N, complex)
    psi[basis_index(states)] = np.exp(np.asarray(problem.logpsi(params, jnp.asarray(states))))
    psi /= np.linalg.norm(psi)
    H = dense_ising(hb.chain(N).bonds, N, 1.0, H_QUENCH)
    mx = np.vdot(psi, sum(site_op(X, i, N) for i in range(N)) @ psi).real / N
    assert abs(metrics["energy"] - np.vdot(psi, H @ psi).real) < 4 * metrics["energy_error"]
    assert abs(metrics["obs/mx"] - mx) < 4 * metrics["obs/mx_error"]


class Tilted(nn.Module):
    """log psi = s.w + 0.1 s_0: not uniform when every parameter is zero."""

    param_dtype: object = jnp.float64

    @nn.compact
    def __call__(self, sigma_xN):
        x = sigma_xN.astype(jnp.float64)
        return x @ self.param("w", nn.initializers.zeros, (x.shape[-1],), jnp.float64) + 0.1 * x[..., 0]


def _experiment(model, initial_state="plus_x"):
    lattice = hb.chain(4)
    task = read({**compose_config(["task=dynamics"])["task"], "initial_state": initial_state}, instantiate)
    problem = Problem(hamiltonians.ising(lattice, J=1.0, h=1.0), model, smp.full_sum(lattice, n_chains=2), None,
                      precond.none())
    return SimpleNamespace(settings=SimpleNamespace(task=task, seed=0), problem=problem, hilbert=lattice)


def test_plus_x_needs_a_model_with_a_uniform_point_whose_tangent_moves():
    from models import RBM

    dyn.check(_experiment(Jastrow(param_dtype=jnp.complex128)))
    dyn.check(_experiment(RBM(alpha=1)))  # each hidden unit attached to one site (tests/lifecycle/test_plus_x.py)
    with pytest.raises(ConfigError, match="task.initial_state is plus_x, which the model Tilted cannot"):
        dyn.check(_experiment(Tilted()))
