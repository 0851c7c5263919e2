"""Run setups and comparisons shared by several test modules: ground-state runs compared step by
step (energies, final checkpoint, final estimate), quenches (task=dynamics) compared time by time,
a small task=excited run, and fake run directories as the runner writes them (for the reports)."""

import functools
import json
import os
import signal
import time

import numpy as np

from runner.lifecycle import checkpoint, preemption


def energies(run_dir):
    return np.array([json.loads(l)["energy"] for l in (run_dir / "metrics.jsonl").read_text().splitlines()])


def checkpoint_leaves(run_dir):
    """Every array of the final checkpoint: parameters, optimizer, chains, CG's state."""
    with np.load(run_dir / "checkpoint" / checkpoint.FILENAME) as data:
        return {k: data[k] for k in sorted(data.files) if k.startswith("leaf_")}


def assert_identical_runs(run_dir, reference, rtol=0.0):
    """The same energies, final checkpoint and final estimate: bit for bit, or within `rtol` (the
    chains' configurations and keys always bit for bit)."""
    close = functools.partial(np.testing.assert_allclose, rtol=rtol, atol=0) if rtol else np.testing.assert_array_equal
    close(energies(run_dir), energies(reference))
    got, want = checkpoint_leaves(run_dir), checkpoint_leaves(reference)
    assert got.keys() == want.keys() and got
    for key in want:
        exact = not rtol or not np.issubdtype(np.asarray(want[key]).dtype, np.inexact)
        (np.testing.assert_array_equal if exact else close)(got[key], want[key], err_msg=key)
    summaries = [json.loads((d / "summary.json").read_text()) for d in (run_dir, reference)]
    close(summaries[0]["energy"], summaries[1]["energy"])
    checks = [s["peak_check"] for s in summaries]  # None after a full sum
    if rtol and checks[0] is not None:
        assert checks[0]["configuration"] == checks[1]["configuration"]
        close(checks[0]["found_log_abs_max"], checks[1]["found_log_abs_max"])
    else:
        assert checks[0] == checks[1]


# --- task=dynamics: a quench from |+x> of a 6-site Ising chain -----------------------------

QUENCH_N, QUENCH_H = 6, 0.5
# M_x = (1/N) sum X_i, and sum over bonds Y_i Z_j: odd under time reversal, so a wrong sign of i flips it.
QUENCH_OBSERVABLES = ["observables=custom", "~observables.operators",
                      (f"+observables.operators={{mx: [{{coeff: {1 / QUENCH_N!r}, ops: X, on: sites}}], "
                       "yz: [{coeff: 1.0, ops: YZ, on: bonds}]}")]
QUENCH = ["task=dynamics", f"hilbert.L={QUENCH_N}", f"hamiltonian.h={QUENCH_H}", "model=jastrow", "dtype=complex128",
          "task.save_every=0.1", *QUENCH_OBSERVABLES]
# The same quench sampled, by an adaptive integrator.
QUENCH_SAMPLED = [*QUENCH, "sampler=metropolis_local", "sampler.n_samples=64", "sampler.n_chains=8",
                  "task/integrator=rk23", "task.integrator.dt=0.02", "task.integrator.atol=1e-4",
                  "task.integrator.rtol=1e-4", "exact=false"]


def trajectory(run_dir):
    """trajectory.jsonl's records without their wall times."""
    lines = (run_dir / "trajectory.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k != "wall_time"} for line in lines]


def assert_same_run(run_dir, reference, rtol=0.0):
    """The same trajectory and final checkpoint: bit for bit, or floats within `rtol` (integers,
    the chains' configurations and keys, always bit for bit)."""
    got, want = trajectory(run_dir), trajectory(reference)
    if not rtol:
        assert got == want
    assert [sorted(r) for r in got] == [sorted(r) for r in want]
    for a, b in zip(got, want):
        for key in b:
            np.testing.assert_allclose(a[key], b[key], rtol=rtol, atol=rtol * 1e-3, err_msg=key)
    got, want = checkpoint_leaves(run_dir), checkpoint_leaves(reference)
    assert got.keys() == want.keys() and got
    for key in want:
        if rtol and np.issubdtype(want[key].dtype, np.inexact):
            np.testing.assert_allclose(got[key], want[key], rtol=rtol, err_msg=key)
        else:
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)


# --- task=excited ---------------------------------------------------------------------------

# task=excited: the K lowest levels of an L-site transverse-field Ising chain at field H, on a small run.
EXCITED_L, EXCITED_H, EXCITED_K = 4, 1.0, 2
EXCITED_TINY = ["task=excited", f"task.n_states={EXCITED_K}", f"hilbert.L={EXCITED_L}", f"hamiltonian.h={EXCITED_H}",
                "dtype=complex128", "sampler.n_samples=512", "sampler.n_chains=16", "final_rounds=4", "seed=1"]


# --- fake run directories, for the reports ----------------------------------------------------

def fake_run(path, overrides, summary=None, energies=(), age_s=0.0, total_sz=None, files=None):
    """A run directory as the runner writes it: .hydra/overrides.yaml and config.yaml (with
    hilbert.total_sz), metrics.jsonl, summary.json, and `files` ({name: JSON object}:
    correlations.json, spectrum.json)."""
    (path / ".hydra").mkdir(parents=True)
    (path / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    sz = "null" if total_sz is None else total_sz
    (path / ".hydra" / "config.yaml").write_text(f"n_iter: 10\nseed: 0\nhilbert:\n  total_sz: {sz}\n")
    for name, content in (files or {}).items():
        (path / name).write_text(json.dumps(content))
    if energies:
        lines = [json.dumps({"step": i, "energy": e, "energy_error": 0.01}) for i, e in enumerate(energies)]
        (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
        stamp = time.time() - age_s
        os.utime(path / "metrics.jsonl", (stamp, stamp))
    if summary is not None:
        (path / "summary.json").write_text(json.dumps(summary))
    return path


def completed(energy, exact=-10.0, **extra):
    return {"status": "completed", "energy": energy, "energy_error": 1e-3, "exact_energy": exact,
            "relative_error": abs(energy - exact) / abs(exact), "v_score": 1e-3, "n_iter": 10,
            "steps_done": 10, "seconds_per_iter": 0.02, "processes": 2, "devices": 2, **extra}


class StopAfterSaved:
    """A StopRequest whose SIGTERM arrives at its `looks`-th look (`requested`) after the run
    checkpointed saved time `index`."""

    def __init__(self, run_dir, index: int, looks: int):
        self.path, self.index, self.looks = run_dir / "checkpoint", index, looks
        self.agreed, self.saved = None, None

    def requested(self) -> bool:
        if (self.path / checkpoint.FILENAME).is_file() and checkpoint.read_meta(self.path)["step"] >= self.index:
            self.looks -= 1
        self.agreed = signal.SIGTERM if self.looks <= 0 else None
        return self.agreed is not None

    status = property(lambda self: preemption.status_of(self.agreed))
    describe = lambda self: "SIGTERM"  # noqa: E731
    hand_over = lambda self: None  # noqa: E731

    def checkpoint_saved(self, index: int):
        self.saved = index
