"""Every task on two real processes (JAX's distributed runtime, 2 CPU devices each) gives the run of
one device: a time evolution's trajectory and checkpoint, and the lowest states' levels."""

import json

import numpy as np
import pytest

from tests.helpers.cli import REPO, run_cli
from tests.helpers.parallel import free_port, start_distributed
from tests.helpers.runs import EXCITED_TINY, QUENCH_SAMPLED, assert_same_run, energies


def _on_one_device_and_two_processes(overrides, tmp_path):
    run_cli([*overrides, f"hydra.run.dir={tmp_path / 'single'}"], REPO, check=True, timeout=600)
    procs = start_distributed(overrides, tmp_path / "dist", free_port())
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    summary = json.loads((tmp_path / "dist" / "summary.json").read_text())
    assert summary["processes"] == 2 and summary["devices"] == 4
    return summary, json.loads((tmp_path / "single" / "summary.json").read_text())


@pytest.mark.slow
def test_a_time_evolution_on_two_processes_is_the_one_device_run(tmp_path):
    """Adaptive rk23 on sampled chains to t = 0.2: the chains bit for bit, the floats to 1e-10
    relative (as between 1 and 4 devices of one process: tests/lifecycle/test_dynamics.py)."""
    _on_one_device_and_two_processes([*QUENCH_SAMPLED, "task.t_end=0.2"], tmp_path)
    assert_same_run(tmp_path / "dist", tmp_path / "single", rtol=1e-10)


@pytest.mark.slow
def test_the_lowest_states_on_two_processes_are_the_one_device_run(tmp_path):
    """task=excited (TFIM chain L=4, K=2, 20 steps): the steps' energies and every level, gap and
    error bar to 1e-10 relative."""
    dist, single = _on_one_device_and_two_processes([*EXCITED_TINY, "n_iter=20"], tmp_path)
    np.testing.assert_allclose(energies(tmp_path / "dist"), energies(tmp_path / "single"), rtol=1e-10)
    for key in ("states", "gaps"):
        for a, b in zip(dist[key], single[key]):
            assert a.keys() == b.keys()
            for field in b:
                np.testing.assert_allclose(a[field], b[field], rtol=1e-10, err_msg=f"{key}.{field}")
