"""runner.lifecycle.dynamics_exact: the free-fermion reference of a large Ising chain's quench
against the Krylov evolution of the same exact state."""

import dataclasses

import numpy as np
import pytest
import yaml

from runner.config.build import build
from runner.lifecycle import dynamics_exact as dyn_exact
from runner.lifecycle import warm_start
from runner.physics import dynamics as exact_dynamics
from runner.physics import hamiltonians
from runner.physics import hilbert as hb
from runner.physics.exact import expectation
from tests.helpers.config import compose_config
from tests.helpers.dense import basis_index, dense_ising


@pytest.mark.parametrize("n_sites,h0,h1", [(8, 0.5, 1.0), (10, 2.0, 0.7)])
@pytest.mark.slow
def test_free_fermion_reference_is_the_exact_quench(tmp_path, monkeypatch, n_sites, h0, h1):
    """A quench of the periodic Ising chain from a ground-state run at h0 (only its config is read)
    to h1: past exact's size the reference comes from free fermions, and on a chain small enough
    for both it equals the exact ground state at h0 evolved by `evolve` (Krylov) to 1e-10, for the
    energy and every observable c sum X_i (the spin set's magnetization_x, a custom 2 sum X_i);
    the Y Z correlator, which free fermions do not give here, is left out."""
    source = tmp_path / "ground_state"
    (source / ".hydra").mkdir(parents=True)
    (source / ".hydra" / "config.yaml").write_text(
        yaml.safe_dump(compose_config([f"hilbert.L={n_sites}", f"hamiltonian.h={h0}", "hamiltonian.J=0.8"])))
    observables = ["observables=custom", "~observables.operators",
                   "+observables.operators={x2: [{coeff: 2.0, ops: X, on: sites}], yz: [{coeff: 1.0, ops: YZ, on: bonds}]}"]
    for obs in (["observables=spin"], observables):
        experiment = build(compose_config(["task=dynamics", f"hilbert.L={n_sites}", f"hamiltonian.h={h1}",
                                           "hamiltonian.J=0.8", "task.initial_state=init_from",
                                           f"init_from={source}", *obs]))
        src = warm_start.Source(source, 0, "", False)
        experiment = dataclasses.replace(experiment, settings=dataclasses.replace(experiment.settings, init_from=src))
        times = [0.0, 0.25, 0.5, 1.0, 2.0]
        monkeypatch.setattr(dyn_exact, "wants_exact", lambda *_: False)
        reference = dyn_exact.exact_trajectory(experiment, None, times)
        assert reference["initial_state"].startswith(f"the exact ground state at h = {h0}")
        lattice = experiment.hilbert
        idx = basis_index(hb.all_states(lattice))
        H0 = dense_ising(lattice.bonds, n_sites, 0.8, h0)[np.ix_(idx, idx)]
        psi_TxD = exact_dynamics.evolve(experiment.hamiltonian, lattice, np.linalg.eigh(H0)[1][:, 0], times)
        operators = {"energy": experiment.hamiltonian,
                     **{f"obs/{n}": op for n, op in zip(experiment.observables.names, experiment.observables.simulated)}}
        krylov = {name: expectation(op, lattice, psi_TxD) for name, op in operators.items()}
        x_keys = {"obs/magnetization_x", "obs/x2"} & set(krylov)
        assert set(reference) == {"t", "energy", "initial_state", *x_keys} and len(x_keys) == 1
        for key in ("energy", *x_keys):
            np.testing.assert_allclose(reference[key], krylov[key], atol=1e-10, err_msg=key)
        assert np.ptp(reference[x_keys.pop()]) > 0.05
    other = dataclasses.replace(experiment, hamiltonian=hamiltonians.ising(lattice, J=1.0, h=h1))
    assert dyn_exact.exact_trajectory(other, None, times) is None  # the source's J differs
