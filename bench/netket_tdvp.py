#!/usr/bin/env python
"""NetKet side of the TDVP benchmark (`bench/tdvp.py`): the 1D quench of `experiment=tfim_quench_1d`
with `netket.experimental.TDVP`, timed per unit of physical time. Prints ONE JSON line on stdout.

The same physics and numerics as the runner's side: the periodic TFIM chain of L sites,
H = -sum Z_i Z_i+1 - h sum X_i (NetKet's `Ising(J=-1)`), a complex translation-symmetric RBM
(`RBMSymm`, alpha 2) started from all-zero parameters (the uniform state, |+x>), 16 Metropolis-local
chains of sweep size L with n_samples samples and a tenth of the samples per chain discarded, the
holomorphic dense QGT, the soft pseudo-inverse 1 / (1 + (rcond lambda_max / lambda)^6)
(`pinv_smooth(rtol_smooth=rcond)`, no hard cut-off), RK4 with step dt, the energy measured at every
`save_every`.

Timing, as the runner's trajectory.jsonl `wall_time` is read by bench/tdvp.py: a callback at each
saved time blocks on the parameters and reads the clock; seconds per unit time are
(clock(last saved time) - clock(first saved time after t = 0)) / (t_last - t_first), so the
compilation and the first interval are left out.

Usage: python bench/netket_tdvp.py [--L 40] [--h 1.0] [--n-samples 4096] [--dt 0.01]
                                   [--t-end 0.3] [--save-every 0.05] [--rcond 1e-6] [--seed 0]
Standalone: imports only netket, jax, numpy and the standard library (run it from a NetKet venv).
"""

import argparse
import functools
import json
import platform
import sys
import time

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)

import netket as nk  # noqa: E402
import netket.experimental as nkx  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--L", type=int, default=40)
    parser.add_argument("--h", type=float, default=1.0)
    parser.add_argument("--n-samples", type=int, default=4096)
    parser.add_argument("--dt", type=float, default=0.01)
    parser.add_argument("--t-end", type=float, default=0.3)
    parser.add_argument("--save-every", type=float, default=0.05)
    parser.add_argument("--rcond", type=float, default=1e-6)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    graph = nk.graph.Chain(args.L, pbc=True)
    hilbert = nk.hilbert.Spin(0.5, N=args.L)
    hamiltonian = nk.operator.IsingJax(hilbert, graph, h=args.h, J=-1.0)
    model = nk.models.RBMSymm(symmetries=graph.translation_group(), alpha=2, param_dtype=complex)
    n_chains = 16
    sampler = nk.sampler.MetropolisLocal(hilbert, n_chains=n_chains, sweep_size=args.L)
    state = nk.vqs.MCState(sampler, model, n_samples=args.n_samples,
                           n_discard_per_chain=args.n_samples // n_chains // 10, seed=args.seed,
                           sampler_seed=args.seed + 1)
    state.parameters = jax.tree_util.tree_map(np.zeros_like, state.parameters)
    driver = nkx.TDVP(hamiltonian, state, nkx.dynamics.RK4(dt=args.dt),
                      qgt=nk.optimizer.qgt.QGTJacobianDense(holomorphic=True),
                      linear_solver=functools.partial(nk.optimizer.solver.pinv_smooth, rtol=1e-14,
                                                      rtol_smooth=args.rcond))
    stops = [round(k * args.save_every, 12) for k in range(1, int(round(args.t_end / args.save_every)) + 1)]
    clock = []

    def saved(step, log_data, driver):
        jax.block_until_ready(driver.state.parameters)
        clock.append((float(driver.t), time.perf_counter()))
        return True

    started = time.perf_counter()
    driver.run(args.t_end, tstops=stops, callback=saved, show_progress=False)
    t_T, wall_T = (np.array(x) for x in zip(*clock))
    first = int(np.argmax(t_T > 1e-12))
    print(json.dumps({
        "code": "netket", "netket": nk.__version__, "jax": jax.__version__, "python": platform.python_version(),
        "callback_times": t_T.tolist(),
        "seconds_per_unit_time": float((wall_T[-1] - wall_T[first]) / (t_T[-1] - t_T[first])),
        "first_interval_s": float(wall_T[first] - started), "n_parameters": int(state.n_parameters),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
