#!/usr/bin/env python
"""NetKet side of bench/equal_time.py: optimise one problem until a wall-clock deadline, then estimate the energy.

Standalone (imports only netket, jax, numpy and the standard library; nothing in vmc-runner imports
it), run from NetKet's own environment. Prints ONE JSON line, last on stdout.

    python bench/netket_equal_time.py PROBLEM --deadline UNIX_TIME --lr LR [--seed S] [--n-samples N]
        [--final-samples M] [--diag-shift D] [--n-chains C] [--symmetries translations|space_group]
        [--layers K] [--features F] [--prior native|none] [--max-steps N]
    python bench/netket_equal_time.py --exact-energies     # the operator check (JSON: lattice -> E0)

PROBLEM: `tri6` (Heisenberg antiferromagnet, 6 x 6 triangular torus, Sz = 0) or `j1j2_6` (J1-J2 square
6 x 6 torus, J2/J1 = 0.5, Sz = 0). H = sum_<ij> (XX + YY + ZZ) [+ J2 sum_<<ij>> ...] in Pauli matrices,
each bond once: `nk.operator.Heisenberg` (whose bond term is zz + 2 (s+s- + s-s+), the Pauli form).
`--prior native` (default) gives NetKet the basis vmc-runner's recipe simulates: Marshall's sign on
the J1 bonds for j1j2_6 (`sign_rule=[True, False]`), the 120-degree three-sublattice rotation for
tri6 (U H U^dagger with U = prod_i exp(-i theta_i Z_i / 2), theta_i = 2 pi k_i / 3, k_i = (x - y) mod 3;
NetKet has no built-in for it, so the bond terms are rotated here). The spectrum is the same either way.

Model: `nk.models.GCNN` (complex parameters, log_cosh activations as NetKet's default), over the
lattice's translations (default; FFT mode) or its space group. Sampler: `MetropolisExchange` on the
lattice graph (nearest neighbours; j1j2_6 also next-nearest, `d_max=2`, as NetKet's J1-J2 example).
Driver: `nk.driver.VMC_SR` with `Sgd(lr)` and `diag_shift` (its NTK form where parameters outnumber
samples, chosen by NetKet).

Timing: the caller passes `--deadline` (time.time() at which its budget ends, counted from before it
started this process, so interpreter start-up, imports and compilation are inside the budget). A
callback ends the run at the first step boundary at or after the deadline (the step in progress
finishes, as vmc-runner's SIGTERM stop does). The final estimate, from `--final-samples` fresh
samples at the final parameters (`MCState.expect`, error bar from NetKet's statistics), is outside it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import sys
import time

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)

import netket as nk  # noqa: E402
from run import REPORTED_ENV  # noqa: E402  (bench/ is on sys.path; run.py imports only the standard library)

PROBLEMS = ("tri6", "j1j2_6")
EXACT = {"tri6": -80.693770, "j1j2_6": -72.548590}  # Pauli units, Sz = 0
N_SAMPLES = {"tri6": 1024, "j1j2_6": 512}  # the vmc-runner recipes' samples per step (triangular_heisenberg, j1j2_square_cnn)
# The operator check's lattices: (problem, extents, total_sz). 3x3 and 3x6 have the 120-degree pattern.
CHECK_LATTICES = (("tri6", (3, 3), 0.5), ("tri6", (3, 6), 0.0), ("tri6", (4, 4), 0.0), ("j1j2_6", (4, 4), 0.0))


def lattice(problem: str, extent=(6, 6)):
    if problem == "tri6":
        return nk.graph.Triangular(list(extent), pbc=True)
    return nk.graph.Square(extent[0], pbc=True, max_neighbor_order=2) if extent[0] == extent[1] else \
        nk.graph.Grid(list(extent), pbc=True, max_neighbor_order=2)


def three_sublattice_operator(hi, g):
    """U H U^dagger of the triangular Heisenberg model, U = prod_i exp(-i theta_i Z_i / 2): on a bond,
    cos d (XX + YY) - sin d (XY - YX) + ZZ with d = theta_i - theta_j."""
    coords = np.asarray(g.basis_coords)[:, :2].astype(int)
    theta = 2 * np.pi * ((coords[:, 0] - coords[:, 1]) % 3) / 3
    if any(e % 3 for e in g.extent):
        raise ValueError(f"the 120-degree pattern needs extents that are multiples of 3, got {g.extent}")
    X = np.array([[0, 1], [1, 0]], complex)
    Y = np.array([[0, -1j], [1j, 0]])
    Z = np.diag([1.0, -1.0]).astype(complex)
    mats, sites = [], []
    for i, j in g.edges():
        d = theta[i] - theta[j]
        mats.append(np.cos(d) * (np.kron(X, X) + np.kron(Y, Y)) - np.sin(d) * (np.kron(X, Y) - np.kron(Y, X))
                    + np.kron(Z, Z))
        sites.append([i, j])
    return nk.operator.LocalOperator(hi, mats, sites, dtype=complex)


def hamiltonian(problem: str, hi, g, prior: str):
    if problem == "tri6":
        if prior == "native" and all(e % 3 == 0 for e in g.extent):
            return three_sublattice_operator(hi, g)
        return nk.operator.Heisenberg(hi, g)
    return nk.operator.Heisenberg(hi, g, J=[1.0, 0.5], sign_rule=[prior == "native", False])


def exact_energies() -> dict:
    """Lowest eigenvalue of each check lattice's operator, both priors (Lanczos)."""
    out = {}
    for problem, extent, total_sz in CHECK_LATTICES:
        g = lattice(problem, extent)
        hi = nk.hilbert.Spin(s=0.5, N=g.n_nodes, total_sz=total_sz)
        for prior in ("native", "none"):
            w = nk.exact.lanczos_ed(hamiltonian(problem, hi, g, prior), k=1, compute_eigenvectors=False,
                                    scipy_args={"tol": 1e-12})
            out[f"{problem} {extent[0]}x{extent[1]} sz={total_sz} prior={prior}"] = float(np.min(np.real(w)))
    for problem in PROBLEMS:
        g = lattice(problem)
        out[f"{problem} bonds per colour"] = [len(g.edges(filter_color=c)) for c in sorted(set(g.edge_colors))]
    return out


def model(g, symmetries: str, layers: int, features: int):
    if symmetries == "space_group":
        return nk.models.GCNN(symmetries=g, layers=layers, features=features, param_dtype=complex)
    return nk.models.GCNN(symmetries=g.translation_group(), mode="fft", shape=tuple(g.extent), layers=layers,
                          features=features, param_dtype=complex)


class Deadline:
    """Callback: records each step's end and energy; returns False (stop) once time.time() >= deadline."""

    def __init__(self, deadline: float, max_steps: int | None):
        self.deadline, self.max_steps = deadline, max_steps
        self.step_ends, self.energies = [], []

    def __call__(self, step, log_data, driver):
        now = time.time()
        self.step_ends.append(now)
        self.energies.append(log_data[driver._loss_name].mean)
        return now < self.deadline and (self.max_steps is None or len(self.step_ends) < self.max_steps)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("problem", nargs="?", choices=PROBLEMS)
    p.add_argument("--exact-energies", action="store_true", help="print the operator check's ground energies")
    p.add_argument("--deadline", type=float, help="time.time() at which the budget ends")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-samples", type=int, default=None, help="samples per step (default: the vmc-runner recipe's)")
    p.add_argument("--n-chains", type=int, default=128)
    p.add_argument("--final-samples", type=int, default=None, help="default: 8 x n_samples")
    p.add_argument("--diag-shift", type=float, default=1e-2)
    p.add_argument("--symmetries", choices=["translations", "space_group"], default="translations")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--features", type=int, default=4)
    p.add_argument("--prior", choices=["native", "none"], default="native")
    p.add_argument("--chunk-size", type=int, default=1024,
                   help="MCState chunk_size, at most the samples per step (bounds the memory)")
    p.add_argument("--max-steps", type=int, default=None, help="also stop after this many steps (probing)")
    args = p.parse_args(argv)
    if args.exact_energies:
        print(json.dumps(exact_energies()), flush=True)
        return 0
    if args.problem is None or args.deadline is None:
        p.error("PROBLEM and --deadline are required")

    n_samples = args.n_samples or N_SAMPLES[args.problem]
    final_samples = args.final_samples or 8 * n_samples
    g = lattice(args.problem)
    hi = nk.hilbert.Spin(s=0.5, N=g.n_nodes, total_sz=0)
    H = hamiltonian(args.problem, hi, g, args.prior)
    sampler = nk.sampler.MetropolisExchange(hi, graph=g, n_chains=args.n_chains,
                                            d_max=2 if args.problem == "j1j2_6" else 1)
    vs = nk.vqs.MCState(sampler, model(g, args.symmetries, args.layers, args.features), n_samples=n_samples,
                        seed=args.seed, sampler_seed=args.seed + 1, chunk_size=min(args.chunk_size, n_samples))
    with _stdout_to_stderr():
        driver = nk.driver.VMC_SR(H, nk.optimizer.Sgd(learning_rate=args.lr), diag_shift=args.diag_shift,
                                  variational_state=vs)
    callback = Deadline(args.deadline, args.max_steps)
    started = time.time()
    driver.run(n_iter=10**9, out=None, show_progress=False, callback=callback)
    jax.block_until_ready(vs.parameters)
    stopped = time.time()
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    energies = [float(np.real(e)) for e in callback.energies]

    t_eval = time.time()
    vs.n_samples = final_samples
    vs.reset()
    final = vs.expect(H)
    energy, error = float(np.real(final.mean)), float(np.real(final.error_of_mean))
    out = {
        "problem": args.problem, "code": "netket", "seed": args.seed, "lr": args.lr, "diag_shift": args.diag_shift,
        "model": f"GCNN({args.symmetries}, layers={args.layers}, features={args.features}, complex)",
        "driver": f"VMC_SR({'NTK' if driver.use_ntk else 'QGT'}, mode={driver.mode})", "prior": args.prior,
        "n_params": int(vs.n_parameters), "n_samples": n_samples, "n_chains": args.n_chains,
        "n_discard_per_chain": vs.n_discard_per_chain,
        "steps": len(energies), "energies": energies,
        "first_step_end": callback.step_ends[0] - args.deadline if callback.step_ends else None,
        "run_started": started - args.deadline, "stopped": stopped - args.deadline,
        "last_step_end": callback.step_ends[-1] - args.deadline if callback.step_ends else None,
        "final_energy": energy, "final_energy_error": error, "final_variance": float(np.real(final.variance)),
        "final_r_hat": _float(getattr(final, "R_hat", None)), "final_samples": vs.n_samples,
        "final_seconds": time.time() - t_eval, "exact_energy": EXACT[args.problem],
        "relative_error": abs((energy - EXACT[args.problem]) / EXACT[args.problem]),
        "peak_rss_mb": peak_rss_mb,
        "versions": {"netket": nk.__version__, "jax": jax.__version__, "numpy": np.__version__,
                     "python": platform.python_version()},
        "env": {k: os.environ.get(k) for k in REPORTED_ENV},
    }
    print(json.dumps(out), flush=True)
    return 0


def _float(x):
    try:
        x = float(np.real(x))
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


class _stdout_to_stderr:
    """NetKet prints its automatic choices; stdout is kept for the JSON line."""

    def __enter__(self):
        self._stdout, sys.stdout = sys.stdout, sys.stderr

    def __exit__(self, *exc):
        sys.stdout = self._stdout
        return False


if __name__ == "__main__":
    sys.exit(main())
