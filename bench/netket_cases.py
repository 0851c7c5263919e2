#!/usr/bin/env python
"""NetKet reference side of the vmc-runner side-by-side benchmark.

Runs one named case with NetKet and prints ONE JSON line on stdout (other lines
NetKet prints come before it).  Two drivers, the same physics, samples, learning
rate (``nk.optimizer.Sgd(0.01)``) and diag_shift (0.01):

- ``--driver vmc``: ``nk.driver.VMC`` + ``nk.optimizer.SR`` with its default solver
  (CG on the lazy QGT); ``holomorphic=True`` for the complex heis1d RBM unless
  ``--holomorphic`` says otherwise.
- ``--driver vmc_sr``: ``nk.driver.VMC_SR`` (dense QGT or NTK, chosen by NetKet,
  solved by its default ``cholesky_with_fallback``).  VMC_SR in 3.23 has no
  holomorphic mode: for a complex model it builds the real 2N x 2N system.

Usage::

    python bench/netket_cases.py CASE [--driver vmc|vmc_sr] [--n-iter N] [--warmup W] [--seed S]
                                      [--final-rounds R] [--holomorphic auto|true|false]
                                      [--save-params F.npz] [--recompute-exact]

CASE is one of ``tfim1d``, ``heis1d``, ``tfim2d`` (RBMs) and ``gcnn_tri6`` (the GCNN
of ``bench/gcnn.py``).  This script is standalone: it
imports only netket, jax, numpy and the standard library, and is meant to be run
from a separate environment that has the optional ``bench`` extra (netket)
installed; it is not imported by vmc-runner.

Timing (the definition bench/run.py also applies to vmc-runner): the steps run
unhindered, with no synchronisation of ours inside the timed interval.  At the
end of step ``warmup`` (1-based; default 10) the parameters, the sampler state
and the energy statistics are blocked on (``jax.block_until_ready``) and the
clock starts; after the last step the same objects are blocked on and the clock
stops.  ``s_per_iter`` is that wall time divided by ``n_iter - warmup``.
``compile_plus_first_iter_s`` is the first step, from its start to the end of a
block on the same objects (tracing + compilation + first sampling/update).
``peak_rss_mb`` is ``ru_maxrss`` read right after the optimisation, before any
exact diagonalisation and before the final fresh estimate.  The process settings
(``OPENBLAS_NUM_THREADS``, ``XLA_FLAGS``, ...) come from the caller's
environment and are reported under ``env``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import sys
import time

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)

import netket as nk  # noqa: E402
from netket.callbacks import AbstractCallback  # noqa: E402
from netket.utils.struct import field  # noqa: E402
from run import REPORTED_ENV  # noqa: E402  (bench/ is on sys.path)

WARMUP = 10
N_CHAINS = 16
LEARNING_RATE = 0.01
DIAG_SHIFT = 0.01
CASES = ("tfim1d", "heis1d", "tfim2d", "gcnn_tri6")

# Ground-state energy of the periodic TFIM chain, H = -sum_i Z_i Z_{i+1} - h sum_i X_i
# (Pauli matrices), L=20, h=1.  Computed once with
#   scipy.sparse.linalg.eigsh(nk.operator.Ising(hi, g, h=1.0, J=-1.0).to_sparse(),
#                             k=1, which="SA", tol=1e-12)
# -> -25.490989686364667 (takes ~15 s and ~3.7 GB of RAM, which is why it is not
# done on every run), and it agrees to 1e-13 with the free-fermion closed form
#   E0 = -sum_{n=0}^{L-1} sqrt(1 + h^2 - 2 h cos k_n),  k_n = pi (2n+1) / L
# (even-parity / Neveu-Schwarz sector), which gives -25.49098968636475.
# `exact_tfim1d(recompute=True)` (CLI: --recompute-exact) redoes the sparse computation.
TFIM1D_L20_H1_EXACT = -25.49098968636475


def tfim_chain_free_fermion(L: int, h: float) -> float:
    """Closed-form ground energy of the periodic TFIM chain (J=1, even L)."""
    k = np.pi * (2 * np.arange(L) + 1) / L
    return float(-np.sum(np.sqrt(1.0 + h * h - 2.0 * h * np.cos(k))))


def sparse_ground_energy(op) -> float:
    """Lowest eigenvalue of a NetKet operator via its sparse matrix (scipy Lanczos)."""
    # nk.exact.lanczos_ed wraps scipy.sparse.linalg.eigsh(which="SA").
    w = nk.exact.lanczos_ed(op, k=1, compute_eigenvectors=False, scipy_args={"tol": 1e-12})
    return float(np.min(np.asarray(w).real))


def exact_tfim1d(recompute: bool = False) -> float:
    if not recompute:
        return TFIM1D_L20_H1_EXACT
    hi, g, H = build_tfim1d_operator()
    return sparse_ground_energy(H)


def build_tfim1d_operator(L: int = 20, h: float = 1.0):
    g = nk.graph.Chain(L, pbc=True)
    hi = nk.hilbert.Spin(s=0.5, N=g.n_nodes)
    # NetKet's Ising is H = -h sum X + J sum ZZ, so J=-1 gives -sum ZZ - h sum X.
    H = nk.operator.Ising(hi, g, h=h, J=-1.0)
    return hi, g, H


def build_case(case: str):
    """Returns a dict with everything the run needs."""
    if case == "tfim1d":
        hi, g, H = build_tfim1d_operator(20, 1.0)
        model = nk.models.RBM(alpha=1, param_dtype=np.float64)
        sampler = nk.sampler.MetropolisLocal(hi, n_chains=N_CHAINS)
        return dict(hilbert=hi, graph=g, H=H, model=model, sampler=sampler,
                    n_samples=1024, n_iter=300, N=g.n_nodes)
    if case == "heis1d":
        g = nk.graph.Chain(16, pbc=True)
        hi = nk.hilbert.Spin(s=0.5, N=g.n_nodes, total_sz=0)
        # Pauli matrices; sign_rule=None -> Marshall sign rule on bipartite graphs.
        H = nk.operator.Heisenberg(hi, g)
        model = nk.models.RBM(alpha=2, param_dtype=np.complex128)
        sampler = nk.sampler.MetropolisExchange(hi, graph=g, n_chains=N_CHAINS)
        return dict(hilbert=hi, graph=g, H=H, model=model, sampler=sampler,
                    n_samples=1024, n_iter=300, N=g.n_nodes)
    if case == "tfim2d":
        g = nk.graph.Square(6, pbc=True)
        hi = nk.hilbert.Spin(s=0.5, N=g.n_nodes)
        H = nk.operator.Ising(hi, g, h=3.0, J=-1.0)
        model = nk.models.RBM(alpha=1, param_dtype=np.float64)
        sampler = nk.sampler.MetropolisLocal(hi, n_chains=N_CHAINS)
        return dict(hilbert=hi, graph=g, H=H, model=model, sampler=sampler,
                    n_samples=2048, n_iter=150, N=g.n_nodes)
    if case == "gcnn_tri6":
        # NetKet's GCNN over the triangular lattice's space group (36 translations x C6v, 432
        # elements; mode "auto" -> FFT over the translations), log_cosh between and after the
        # layers as vmc-runner's gcnn. No sign rule: the triangular lattice is not bipartite.
        g = nk.graph.Triangular([6, 6], pbc=True)
        hi = nk.hilbert.Spin(s=0.5, N=g.n_nodes, total_sz=0)
        H = nk.operator.Heisenberg(hi, g)
        model = nk.models.GCNN(symmetries=g, layers=2, features=(8, 8), param_dtype=np.complex128,
                               activation=nk.nn.log_cosh, output_activation=nk.nn.log_cosh)
        sampler = nk.sampler.MetropolisExchange(hi, graph=g, n_chains=N_CHAINS)
        return dict(hilbert=hi, graph=g, H=H, model=model, sampler=sampler,
                    n_samples=512, n_iter=14, N=g.n_nodes)
    raise SystemExit(f"unknown case {case!r}; choose one of {', '.join(CASES)}")


def reference_energy(case: str, spec: dict, recompute: bool) -> float | None:
    if case == "tfim1d":
        return exact_tfim1d(recompute)
    if case == "heis1d":
        # 12870 states in the Sz=0 sector: cheap, so always computed.
        return sparse_ground_energy(spec["H"])
    return None


class _Timer(AbstractCallback):
    """Wall-clock marks at the end of the first step and of step `warmup`, each after a block
    on the driver's state; no synchronisation on the other steps. The energy statistics are
    kept as device values and read only after the run."""

    warmup: int = field(pytree_node=False)
    marks: dict = field(pytree_node=False)
    stats: list = field(pytree_node=False)
    _t0: object = field(pytree_node=False)

    def __init__(self, warmup: int):
        self.warmup = warmup
        self.marks: dict[str, float] = {}
        self.stats: list = []
        self._t0 = None

    def on_run_start(self, step, driver):
        self._t0 = time.perf_counter()

    def on_step_end(self, step, log_data, driver):
        self.stats.append(driver._loss_stats)
        done = len(self.stats)
        if done == 1 or done == self.warmup:
            synchronize(driver)
            now = time.perf_counter()
            if done == 1:
                self.marks["first_step_s"] = now - self._t0
            if done == self.warmup:
                self.marks["timed_start"] = now


def synchronize(driver):
    """Waits for everything the driver has dispatched: parameters, sampler state, energy."""
    vs = driver.state
    jax.block_until_ready((vs.parameters, vs.sampler_state, driver._loss_stats))


def _rss_mb() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports kB, macOS bytes.
    return r / (1024 * 1024) if sys.platform == "darwin" else r / 1024


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("case", choices=CASES)
    p.add_argument("--n-iter", type=int, default=None, help="default: the case's own count")
    p.add_argument("--driver", choices=["vmc", "vmc_sr"], default="vmc",
                   help="vmc: VMC + SR (CG); vmc_sr: VMC_SR (dense QGT/NTK, Cholesky)")
    p.add_argument("--warmup", type=int, default=WARMUP,
                   help="steps before the timed interval (the clock starts after a sync at the end of this step)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--final-rounds", type=int, default=1,
                   help="the final energy uses this many times n_samples fresh samples")
    p.add_argument("--save-params", default=None,
                   help="write the final RBM parameters here (.npz: kernel, hidden_bias, visible_bias)")
    p.add_argument("--recompute-exact", action="store_true",
                   help="recompute the hard-coded tfim1d exact energy with scipy (slow, ~4 GB)")
    p.add_argument("--holomorphic", choices=["auto", "true", "false"], default="auto",
                   help="SR's holomorphic flag (--driver vmc); 'auto': true for a complex-parameter "
                        "model (heis1d's RBM is holomorphic), NetKet's default otherwise")
    args = p.parse_args(argv)

    spec = build_case(args.case)
    n_iter = args.n_iter if args.n_iter is not None else spec["n_iter"]
    if not 1 <= args.warmup < n_iter:
        p.error(f"--warmup must be at least 1 and below the number of steps ({n_iter})")
    complex_model = np.issubdtype(spec["model"].param_dtype, np.complexfloating)
    holomorphic = {"true": True, "false": False, "auto": None}[args.holomorphic]
    if args.holomorphic == "auto" and complex_model:
        holomorphic = True  # the RBM is holomorphic in its parameters: no doubled real system

    t_setup = time.perf_counter()
    vs = nk.vqs.MCState(
        spec["sampler"], spec["model"], n_samples=spec["n_samples"],
        seed=args.seed, sampler_seed=args.seed + 1,
    )
    opt = nk.optimizer.Sgd(learning_rate=LEARNING_RATE)
    if args.driver == "vmc":
        sr_kwargs = {} if holomorphic is None else {"holomorphic": holomorphic}
        sr = nk.optimizer.SR(diag_shift=DIAG_SHIFT, **sr_kwargs)
        driver = nk.driver.VMC(spec["H"], opt, variational_state=vs, preconditioner=sr)
        solver = f"VMC + SR(diag_shift={DIAG_SHIFT}, default solver (CG), holomorphic={holomorphic})"
    else:
        # NetKet's own printout of its automatic choices goes to stderr: stdout is the JSON line.
        with contextlib.redirect_stdout(sys.stderr):
            driver = nk.driver.VMC_SR(spec["H"], opt, diag_shift=DIAG_SHIFT, variational_state=vs)
        solver = (f"VMC_SR(diag_shift={DIAG_SHIFT}, {'NTK' if driver.use_ntk else 'QGT'}, "
                  f"mode={driver.mode}, cholesky_with_fallback)")
    setup_s = time.perf_counter() - t_setup

    timer = _Timer(args.warmup)
    t_run = time.perf_counter()
    driver.run(n_iter, out=None, show_progress=False, callback=timer)
    synchronize(driver)
    t_end = time.perf_counter()
    run_s = t_end - t_run
    peak_rss = _rss_mb()
    timed_s = t_end - timer.marks["timed_start"]
    energies = [float(np.real(stats.mean)) for stats in timer.stats]

    # Final energy at the final parameters, from fresh samples.
    vs.n_samples = args.final_rounds * spec["n_samples"]
    vs.reset()
    final = vs.expect(spec["H"])
    e_final = float(np.real(final.mean))
    variance_final = float(np.real(final.variance))
    e_err = float(np.real(final.error_of_mean))

    if args.save_params and "Dense" in vs.parameters:  # the RBM cases: their final state is evaluated exactly
        params = vs.parameters
        np.savez(args.save_params, kernel=np.asarray(params["Dense"]["kernel"]),
                 hidden_bias=np.asarray(params["Dense"]["bias"]), visible_bias=np.asarray(params["visible_bias"]))

    e_ref = reference_energy(args.case, spec, args.recompute_exact)
    N = spec["N"]
    out = {
        "case": args.case,
        "code": "netket",
        "n_iter": n_iter,
        "seed": args.seed,
        "n_samples": vs.n_samples,
        "n_chains": vs.sampler.n_chains,
        "n_discard_per_chain": vs.n_discard_per_chain,
        "n_params": int(vs.n_parameters),
        "optimizer": f"Sgd({LEARNING_RATE})",
        "driver": args.driver,
        "preconditioner": solver,
        "warmup": args.warmup,
        "timed_steps": n_iter - args.warmup,
        "timed_wall_s": timed_s,
        "s_per_iter": timed_s / (n_iter - args.warmup),
        "compile_plus_first_iter_s": timer.marks["first_step_s"],
        "setup_s": setup_s,
        "run_wall_s": run_s,
        "final_energy": e_final,
        "final_energy_error": e_err,
        "final_variance": variance_final,
        "last_iter_energy": energies[-1],
        "energies": energies,
        "exact_energy": e_ref,
        "relative_error": (abs((e_final - e_ref) / e_ref) if e_ref is not None else None),
        "energy_per_site": e_final / N,
        "n_sites": N,
        "peak_rss_mb": peak_rss,
        "versions": {
            "netket": nk.__version__,
            "jax": jax.__version__,
            "jaxlib": _jaxlib_version(),
            "numpy": np.__version__,
            "python": platform.python_version(),
        },
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "env": {k: os.environ.get(k) for k in REPORTED_ENV},
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
    }
    print(json.dumps(out), flush=True)
    return 0


def _jaxlib_version():
    try:
        import jaxlib

        return jaxlib.__version__
    except Exception:  # pragma: no cover
        return None


if __name__ == "__main__":
    sys.exit(main())
