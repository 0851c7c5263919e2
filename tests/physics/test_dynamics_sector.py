"""The exact reference dynamics in an Sz sector, observables that leave the sector included, against
dense matrix exponentials on the full 2^N space; the reproducer of issue 57 (live bug 1) on the CLI."""

import json

import numpy as np
import pytest
import scipy.linalg

from runner.physics import dynamics, exact, hamiltonians, observables, pauli
from runner.physics import hilbert as hb
from tests.helpers.cli import REPO, run_cli
from tests.helpers.dense import basis_index, dense_pauli

TIMES = np.array([0.0, 0.2, 0.5, 1.1])


def _embedded_trajectory(ham, lattice, psi0_D, times):
    """(the sector state psi0 put on the full 2^N space and evolved there by a dense expm [T, 2^N],
    the full-space index of each sector state [D])."""
    idx = basis_index(hb.all_states(lattice))
    full0 = np.zeros(2**lattice.n_sites, complex)
    full0[idx] = psi0_D
    H = dense_pauli(ham.terms, lattice.n_sites)
    return np.stack([scipy.linalg.expm(-1j * H * t) @ full0 for t in times]), idx


def _operators(lattice, ham):
    """{name: PauliSum}: the spin set as the run simulates it (rotated like `ham`), and operators
    that partly leave the sector (X_0 X_1 has an Sz-conserving part, X_0 Y_2 + 0.3 Z_1 a diagonal one)."""
    spin = observables.spin(lattice, ham)
    n = lattice.n_sites
    extra = {"x0x1": pauli.pauli_sum(n, [(1.0, "XX", (0, 1))]),
             "x0y2_z1": pauli.pauli_sum(n, [(1.0, "XY", (0, 2)), (0.3, "Z", (1,))]),
             "energy": ham}
    return {**dict(zip(spin.names, spin.simulated)), **extra}


@pytest.mark.parametrize("prior", ["none", "marshall"])
def test_sector_expectations_match_the_full_space(prior):
    """Every observable, off-diagonal in Sz or not, has the expectation of the full-space state the
    sector state is (exp(-i H t) psi0 by dense expm on all 2^N states, which stays in the sector):
    magnetization_x is exactly 0 there, X_0 X_1 is not."""
    lattice = hb.chain(6, total_sz=0)
    ham = hamiltonians.heisenberg(lattice, J=1.0, J2=0.3, phase_prior=prior)
    rng = np.random.default_rng(1)
    psi0_D = rng.standard_normal(lattice.n_states) + 1j * rng.standard_normal(lattice.n_states)
    full_TxF, idx = _embedded_trajectory(ham, lattice, psi0_D, TIMES)
    outside = np.setdiff1d(np.arange(2**lattice.n_sites), idx)
    assert np.max(np.abs(full_TxF[:, outside])) < 1e-12  # H conserves Sz: the state stays in the sector

    psi_TxD = dynamics.evolve(ham, lattice, psi0_D, TIMES)
    ops = _operators(lattice, ham)
    measured = {name: exact.expectation(op, lattice, psi_TxD) for name, op in ops.items()}
    for name, op in ops.items():
        M = dense_pauli(op.terms, lattice.n_sites)
        expected = [np.vdot(p, M @ p).real / np.vdot(p, p).real for p in full_TxF]
        np.testing.assert_allclose(measured[name], expected, atol=1e-11, err_msg=name)
    np.testing.assert_allclose(measured["magnetization_x"], 0.0, atol=1e-15)
    assert np.min(np.abs(measured["x0x1"])) > 1e-3  # an off-sector operator's in-sector part counts


def test_a_trajectory_s_expectations_are_each_state_s():
    """`runner.physics.exact.expectation` of a trajectory [T, D] is that of each state, bit for bit,
    and the energy `exact.energy_of` (one expectation path for the static and the dynamic reference)."""
    lattice = hb.chain(6, total_sz=0)
    ham = hamiltonians.heisenberg(lattice)
    psi_TxD = dynamics.evolve(ham, lattice, np.arange(1.0, lattice.n_states + 1), TIMES)
    ops = _operators(lattice, ham)
    measured = {name: exact.expectation(op, lattice, psi_TxD) for name, op in ops.items()}
    for name, op in ops.items():
        np.testing.assert_array_equal(measured[name], [exact.expectation(op, lattice, p) for p in psi_TxD])
    np.testing.assert_array_equal(measured["energy"], [exact.energy_of(ham, lattice, p) for p in psi_TxD])


def test_energy_of_refuses_what_leaves_the_sector():
    """The energy of a sector state needs an H that conserves Sz; an observable may leave it."""
    lattice = hb.chain(4, total_sz=0)
    x = pauli.pauli_sum(4, [(1.0, "X", (0,))])
    with pytest.raises(ValueError, match="Sz-conserving"):
        exact.energy_of(x, lattice, np.ones(lattice.n_states))
    assert exact.expectation(x, lattice, np.ones(lattice.n_states)) == 0.0


@pytest.mark.slow
def test_dynamics_run_in_a_sector_with_spin_observables(tmp_path):
    """Issue 57, live bug 1: a dynamics run in an Sz sector with the spin set (magnetization_x leaves
    the sector) finishes, its exact reference giving magnetization_x = 0 at every saved time."""
    run_dir = tmp_path / "run"
    proc = run_cli(["task=dynamics", "hilbert=chain", "hilbert.L=6", "hilbert.total_sz=0", "hamiltonian=heisenberg",
                    "sampler=metropolis_exchange", "sampler.n_chains=16", "sampler.n_samples=256",
                    "observables=spin", "dtype=complex128", "model=jastrow", "task.t_end=0.04", "task.integrator.dt=0.02",
                    "task.save_every=0.02", f"hydra.run.dir={run_dir}"], REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    trajectory = json.loads((run_dir / "exact_trajectory.json").read_text())
    assert trajectory["t"] == pytest.approx([0.0, 0.02, 0.04])
    assert trajectory["obs/magnetization_x"] == pytest.approx([0.0] * 3, abs=1e-14)
    assert len(trajectory["obs/xx_nn"]) == 3 and len(trajectory["energy"]) == 3
