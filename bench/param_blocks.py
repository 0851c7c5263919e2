"""Memory and time of one minSR solve against `preconditioner.param_chunk_size`.

The model: the ViT on the 6 x 6 lattice with d_model 64, 4 heads, 4 layers (141,648 real
parameters in 60 leaves, none above 8,192; log psi complex), 1,024 samples in 16 chains, where
the whole Jacobian O takes 2.3 GB. What is timed is what the setting changes: one jitted minSR
solve (the Jacobian's chunks, the kernel, the solve, x = A^H y) of the runner's `vmc.jacobian` at
the initial parameters, on random Sz = 0 configurations, the median of 3 calls after a first one.
(A whole run of this ViT is not measured: at its initial parameters the chains barely move and
the energy is 6e15, the next step NaN, with every setting.) Each setting runs in a fresh process:
the compiled program's temporary memory (XLA's `memory_analysis`) and the process's peak RSS
(compile and run). Prints a markdown table:

    python bench/param_blocks.py [--blocks 1 8] [--chunks none 128]

`--blocks k` sets param_chunk_size = P // k (k = 1: null, all parameters at once).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

CASE = ["hilbert=square", "hilbert.L=6", "hilbert.total_sz=0", "hamiltonian=heisenberg", "hamiltonian.J2=0.5",
        "hamiltonian.phase_prior=marshall", "sampler=metropolis_exchange", "model=vit", "model.d_model=64",
        "model.n_heads=4", "model.n_layers=4", "dtype=float64", "sampler.n_samples=1024", "sampler.n_chains=16",
        "preconditioner=minsr", "exact=false"]


def one(chunk, k):
    """Measures one setting in this process; prints one JSON line."""
    import dataclasses
    import resource

    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np

    from runner.config.build import build
    from runner.core import precond
    from runner.core.jacobian import jacobian, parameter_blocks
    from runner.core.vmc import init_state
    from runner.core.wavefunction import gradient_mode
    from tests.helpers.config import compose_config

    experiment = build(compose_config(CASE))
    problem, n_sites = experiment.problem, experiment.hilbert.n_sites
    state = init_state(problem, 0, jnp.ones((n_sites,), jnp.int8))
    n_params = sum(x.size for x in jax.tree_util.tree_leaves(state.params))
    size = None if k == 1 else n_params // k
    rng = np.random.default_rng(0)
    spins = np.tile(np.repeat(np.array([1, -1], np.int8), n_sites // 2), (1024, 1))
    sigma = jnp.asarray(rng.permuted(spins, axis=1).reshape(16, 64, n_sites))
    eps = jnp.asarray(rng.normal(size=1024))
    p = dataclasses.replace(problem, chunk_size=chunk, precondition=precond.minsr(0.01, param_chunk_size=size))
    mode = gradient_mode(state.params, problem.model)
    solve = jax.jit(lambda params, s, e: p.precondition(jacobian(p, params, s, mode), e, "real"))
    compiled = solve.lower(state.params, sigma, eps).compile()
    jax.block_until_ready(compiled(state.params, sigma, eps))
    times = []
    for _ in range(3):
        start = time.perf_counter()
        jax.block_until_ready(compiled(state.params, sigma, eps))
        times.append(time.perf_counter() - start)
    print(json.dumps({"n_params": int(n_params), "param_chunk_size": size, "chunk_size": chunk,
                      "blocks": len(parameter_blocks(state.params, size)) if size else 1,
                      "temp_mb": compiled.memory_analysis().temp_size_in_bytes / 1e6,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3,
                      "seconds": statistics.median(times)}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--chunks", nargs="+", default=["none", "128"])
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        chunk, k = args.one
        return one(None if chunk == "none" else int(chunk), int(k))
    from memory import machine

    rows = []
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    for chunk in args.chunks:
        for k in args.blocks:
            out = subprocess.run([sys.executable, __file__, "--one", chunk, str(k)], cwd=REPO, env=env,
                                 capture_output=True, text=True, check=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
            print(rows[-1], file=sys.stderr, flush=True)
    print(f"One minSR solve against `preconditioner.param_chunk_size`: ViT (d_model 64, 4 heads, 4 layers; "
          f"{rows[0]['n_params']:,} real parameters, complex log psi) on the 6 x 6 lattice, 1,024 samples in 16 "
          f"chains, one fresh process per setting. Machine: {machine()}.\n")
    print("| chunk_size | param_chunk_size (blocks) | compiled temporary MB | peak RSS MB | s / solve |")
    print("|---|---|---|---|---|")
    for r in rows:
        blocks = "null (1)" if r["param_chunk_size"] is None else f"{r['param_chunk_size']:,} ({r['blocks']})"
        print(f"| {r['chunk_size'] or 'null'} | {blocks} | {r['temp_mb']:.0f} | {r['peak_rss_mb']:.0f} | "
              f"{r['seconds']:.2f} |")


if __name__ == "__main__":
    main()
