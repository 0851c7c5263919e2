"""A time evolution's summary and last log line name its energy per site and its unit, as a
ground-state run's do (summary.UNIT_FIELDS; issue 56 item 10)."""

import json

import pytest

import runner
from runner import cli
from runner.outputs import summary as summary_fields

L = 4
QUENCH = ["task=dynamics", f"hilbert.L={L}", "model=jastrow", "dtype=complex128", "sampler=full_sum",
          "task.t_end=0.02", "task.integrator.dt=0.01", "task.save_every=0.01"]


@pytest.mark.parametrize("hamiltonian", ["ising", "heisenberg"])
def test_the_dynamics_summary_has_energies_per_site_and_the_unit(tmp_path, hamiltonian):
    run_dir = tmp_path / hamiltonian
    runner.run([*QUENCH, f"hamiltonian={hamiltonian}"], run_dir=run_dir, quiet=True)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["n_sites"] == L
    unit = summary_fields.energy_unit(f"runner.physics.hamiltonians.{hamiltonian}")
    assert summary["energy_unit"] == unit
    assert summary["energy_per_site"] == pytest.approx(summary["energy"] / L)
    assert summary["energy_error_per_site"] == pytest.approx(summary["energy_error"] / L)
    last = [line for line in (run_dir / cli.LOG_FILE).read_text().splitlines() if "dynamics completed" in line]
    assert last, "no final line"
    assert f"energy {summary['energy']:.10f} ± {summary['energy_error']:.2e}" in last[-1]
    per_site = f"{summary['energy_per_site']:.10f} ± {summary['energy_error_per_site']:.2e}"
    assert f"(energy/N = {per_site}) in {unit}" in last[-1]
    assert "max |error| against exact: {" in last[-1]
