"""Energies per site beside totals with their unit named (summary.json, the report, the header,
energy.png, dynamics.png, the sweep plots); dynamics.png leaves out panels constant by symmetry and draws a
conserved energy as E(t) - E(0); the chain S(q) plot labels the
largest S(q)'s q; the dynamics header leaves out what dynamics does not use (issue 56 item 10)."""

import logging
import re
import types

import numpy as np
import pytest

from runner.outputs import plot, structure_factor_plot, summary, trajectory_plot


@pytest.mark.parametrize("target, spin_spin", [("runner.physics.hamiltonians.heisenberg", True),
                                               ("runner.physics.hamiltonians.xxz", True),
                                               ("runner.physics.hamiltonians.ising", False),
                                               ("runner.physics.hamiltonians.pauli", False)])
def test_energy_unit_names_pauli_and_the_spin_spin_conversion(target, spin_spin):
    unit = summary.energy_unit(target)
    assert "Pauli" in unit
    assert ("4 S.S" in unit) == spin_spin


def test_estimate_fields_hold_energies_per_site():
    fields = summary.estimate_fields(8, {"energy": -12.0, "energy_error": 0.08, "variance": 1.0}, -13.6)
    assert fields["energy_per_site"] == pytest.approx(-1.5)
    assert fields["energy_error_per_site"] == pytest.approx(0.01)
    assert fields["exact_energy_per_site"] == pytest.approx(-1.7)
    empty = summary.estimate_fields(8, {}, None)
    assert empty["energy_per_site"] is None and empty["exact_energy_per_site"] is None


def test_report_logs_per_site_energies_and_the_unit(caplog):
    s = {"status": "completed", "energy": -12.0, "energy_error": 0.08, "v_score": 0.01, "exact_energy": -13.6,
         "n_sites": 8, "energy_unit": summary.energy_unit("heisenberg"), "seconds_per_iter": None,
         "relative_error": None, "warnings": []}
    with caplog.at_level(logging.INFO, logger="runner.outputs.summary"):
        summary.report(s)
    assert "energy/N = -1.5000000000 ± 1.00e-02" in caplog.text
    assert "exact energy/N = -1.7000000000" in caplog.text
    assert "energy unit: Pauli (sigma.sigma = 4 S.S" in caplog.text


def converging(n=20):
    return [{"step": i, "energy": -10.0 + 2.0 * 0.8**i, "energy_error": 0.01, "variance": 1.0} for i in range(n)]


def test_energy_png_names_the_unit_and_has_a_per_site_axis(tmp_path):
    fig = plot.plot_energy(converging(), -10.0, tmp_path / "energy.png", n_sites=4, unit="Pauli (sigma = 2S)")
    top = fig.axes[0]
    assert top.get_ylabel() == "energy [Pauli (sigma = 2S)]"
    (right,) = top.child_axes
    assert right.get_ylabel() == "energy per site (N = 4)"
    assert any("-2.500000 per site" in t.get_text() for t in top.get_legend().get_texts())


def test_energy_png_without_sites_or_unit_is_as_before(tmp_path):
    fig = plot.plot_energy(converging(), None, tmp_path / "energy.png")
    assert fig.axes[0].get_ylabel() == "energy" and not fig.axes[0].child_axes


def trajectory(n=6):
    t = np.linspace(0, 0.5, n)
    return [{"t": float(x), "energy": -3.0 + 1e-14 * k, "energy_error": 0.0, "obs/magnetization_x": float(np.cos(x)),
             "obs/magnetization_z": 1e-16 * (-1) ** k, "obs/magnetization_z_error": 0.0}
            for k, x in enumerate(t)], t


def test_dynamics_png_leaves_out_panels_constant_by_symmetry(tmp_path):
    records, t = trajectory()
    exact = {"t": list(t), "energy": [-3.0] * len(t), "obs/magnetization_x": list(np.cos(t)),
             "obs/magnetization_z": [0.0] * len(t)}
    fig = trajectory_plot.plot_trajectory(records, exact, tmp_path / "dynamics.png")
    drawn = [ax.get_ylabel() for ax in fig.axes]
    assert drawn == ["magnetization_x"]
    title = fig._suptitle.get_text()
    assert "not drawn" in title and "energy = -3" in title and "magnetization_z" in title


def test_a_panel_stays_when_either_curve_moves(tmp_path):
    records, t = trajectory()
    exact = {"t": list(t), "obs/magnetization_z": list(0.1 * t)}  # the exact curve moves: TDVP missed it
    assert not trajectory_plot.constant(records, exact, "obs/magnetization_z")
    assert trajectory_plot.constant(records, None, "obs/magnetization_z")


def drifting(n=6, drift=1e-8):
    """A real-time trajectory whose energy -8 drifts by `drift` t (TDVP's error on a conserved energy)."""
    t = np.linspace(0, 0.5, n)
    return [{"t": float(x), "energy": -8.0 + drift * x, "energy_error": 0.0, "obs/magnetization_x": float(np.cos(x))}
            for x in t], t


def offset_free(ax) -> bool:
    """Whether the y axis reads without an offset ("1e-9-7.99999999"): a power of ten at most."""
    ax.figure.canvas.draw()
    return re.fullmatch(r"(1e[-\u2212]\d+)?", ax.yaxis.get_offset_text().get_text()) is not None


def test_dynamics_png_draws_a_conserved_energy_as_its_drift_in_the_unit(tmp_path):
    records, t = drifting()
    exact = {"t": list(t), "energy": [-8.0] * len(t), "obs/magnetization_x": list(np.cos(t))}
    fig = trajectory_plot.plot_trajectory(records, exact, tmp_path / "dynamics.png", unit="Pauli (sigma = 2S)")
    energy, _ = fig.axes
    assert energy.get_ylabel() == "E(t) - E(0)\n[Pauli (sigma = 2S)]"
    assert energy.get_title(loc="right") == "E(0) = -8"
    np.testing.assert_allclose(energy.containers[0].lines[0].get_xydata()[:, 1], 1e-8 * t, atol=1e-15)
    np.testing.assert_allclose(energy.lines[-1].get_ydata(), 0.0)  # the exact curve
    assert offset_free(energy)
    runs = [("h=1", records, exact), ("h=2", [dict(r, energy=2 * r["energy"]) for r in records], None)]
    energy, _ = trajectory_plot.plot_trajectories(runs, tmp_path / "sweep.png", unit="Pauli (sigma = 2S)").axes
    assert energy.get_ylabel() == "E(t) - E(0)\n[Pauli (sigma = 2S)]" and offset_free(energy)
    np.testing.assert_allclose(energy.containers[1].lines[0].get_xydata()[:, 1], 2e-8 * t, atol=1e-15)


def test_dynamics_png_draws_an_energy_that_moves_as_it_is_with_no_offset(tmp_path):
    records, _ = drifting(drift=2e-3)  # above CONSERVED_TOLERANCE of |E|: E(t) itself
    assert trajectory_plot.conserved_energy(records, None) is None
    energy, _ = trajectory_plot.plot_trajectory(records, None, tmp_path / "dynamics.png").axes
    assert energy.get_ylabel() == "energy" and energy.get_title(loc="right") == ""
    assert offset_free(energy) and energy.yaxis.get_offset_text().get_text() == ""
    np.testing.assert_allclose(energy.containers[0].lines[0].get_xydata()[0, 1], -8.0)


def test_chain_structure_factor_labels_the_largest_q(tmp_path):
    momenta = np.linspace(0, 2 * np.pi, 6, endpoint=False)[:, None]
    values = 1 + np.cos(momenta[:, 0] - np.pi)
    run = {"status": "completed", "correlations": {"momenta": momenta.tolist(), "structure_factor": values.tolist()}}
    fig = structure_factor_plot.plot_structure_factor([run], ["a=1"], tmp_path / "sq.png")
    (ax,) = fig.axes
    texts = [t.get_text() for t in ax.texts]
    assert any(f"at q = 1\u03c0 ({np.pi:.4f})" in t for t in texts), texts


def test_dynamics_header_leaves_out_the_optimizer_and_steps(caplog):
    from runner.config.build import build
    from runner.outputs.header import log_header
    from tests.helpers.config import compose_config

    config = compose_config(["task=dynamics", "hilbert.L=4", "dtype=complex128", "sampler=full_sum",
                             "model=jastrow", "task.t_end=0.1"])
    with caplog.at_level("INFO"):
        log_header(build(config), types.SimpleNamespace(n_devices=1), config)
    assert "task: dynamics(" in caplog.text and "energies in Pauli" in caplog.text
    assert "optimizer:" not in caplog.text and "steps:" not in caplog.text and "checkpoint every" not in caplog.text
    assert "sampler: full_sum" in caplog.text
    assert "integrator=rk4" in caplog.text and "atol=" not in caplog.text and "dt_max=" not in caplog.text
