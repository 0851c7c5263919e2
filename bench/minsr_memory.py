"""Peak memory and time per VMC step of minSR against chunk_size, P = 21,348 and S = 2,048.

Each setting runs `python -m runner` in a fresh process and reads that process's peak resident
memory (ru_maxrss from wait4), so compile-time and run-time peaks are both counted. The model:
an RBM with alpha=16 on a 36-site Ising chain (21,348 real parameters) and 2,048 samples in 16
chains, where the whole Jacobian O takes 334 MiB and the sample-space kernel 32 MiB. `--repo`
runs another checkout (e.g. an older commit) for comparison. Prints a markdown table:

    python bench/minsr_memory.py [--chunks none 512 256 128] [--n-iter 2] [--repo PATH]
"""

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from memory import machine, measure, over_chunks, print_table  # noqa: E402

CASE = ["hilbert=chain", "hilbert.L=36", "hamiltonian=ising", "hamiltonian.h=1.0", "model=rbm", "model.alpha=16",
        "dtype=float64", "sampler=metropolis_local", "sampler.n_samples=2048", "sampler.n_chains=16",
        "sampler.n_discard_per_chain=5", "preconditioner=minsr", "exact=false", "final_rounds=1",
        "checkpoint_every=100000"]


def run_one(repo, chunk, n_iter):
    """`memory.measure` of the case at one chunk_size, in the checkout `repo`."""
    automatic = "memory_budget:" in (Path(repo) / "conf" / "config.yaml").read_text()  # chunks only as set here
    return measure(repo, [*CASE, f"chunk_size={chunk}", f"n_iter={n_iter}", *(["memory_budget=null"] * automatic)])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", nargs="+", default=["none", "512", "256", "128"])
    parser.add_argument("--n-iter", type=int, default=2)
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout to run (default: this one)")
    args = parser.parse_args()
    rows, n_params = over_chunks(args.chunks, lambda chunk: run_one(args.repo, chunk, args.n_iter))
    print(f"minSR's peak memory against `chunk_size`: RBM alpha=16 on a 36-site Ising chain ({n_params:,} real "
          f"parameters), 2,048 samples in 16 chains, {args.n_iter} steps, one fresh process per setting "
          f"({args.repo}). Machine: {machine()}.\n")
    print_table(rows)


if __name__ == "__main__":
    main()
