"""Peak memory and time per VMC step against chunk_size, SR by conjugate gradients, ~1e5 parameters.

Each setting runs `python -m runner` in a fresh process and reads that process's peak resident
memory (ru_maxrss from wait4), so compile-time and run-time peaks are both counted. The model:
an RBM on a 100-site Ising chain with alpha=10 (101,100 real parameters) and 4,096 samples
(16 chains), where a dense O would take 3.3 GB and the local energies of all samples at once
about as much. Prints a markdown table with the machine and versions:

    python bench/memory.py [--chunks none 2048 512 128] [--n-iter 4] [--cg-maxiter 20]
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CASE = ["hilbert=chain", "hilbert.L=100", "hamiltonian=ising", "hamiltonian.h=1.0", "model=rbm", "model.alpha=10",
        "dtype=float64", "sampler=metropolis_local", "sampler.n_samples=4096", "sampler.n_chains=16",
        "sampler.n_discard_per_chain=5", "preconditioner=sr", "preconditioner.solver=cg", "exact=false",
        "final_rounds=1", "checkpoint_every=100000", "memory_budget=null"]  # chunks only as each run sets them


def fresh_process(repo, args):
    """(output, peak RSS in MiB, wall seconds) of `python -m runner args` run in `repo` in a fresh
    process (ru_maxrss from wait4); RuntimeError with the output's end if it fails."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "runner", *args], cwd=repo, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{out[-3000:]}")
    return out, usage.ru_maxrss / 1024, wall


def measure(repo, overrides):
    """(peak RSS in MiB, seconds per step, wall seconds, n_params) of `python -m runner overrides`
    run in `repo` in a fresh process."""
    with tempfile.TemporaryDirectory() as tmp:
        _, rss, wall = fresh_process(repo, [*overrides, f"hydra.run.dir={tmp}"])
        summary = json.loads((Path(tmp) / "summary.json").read_text())
    return rss, summary["seconds_per_iter"], wall, summary["n_params"]


def run_one(chunk, n_iter, cg_maxiter):
    """`measure` of the case at one chunk_size."""
    return measure(REPO, [*CASE, f"chunk_size={chunk}", f"n_iter={n_iter}", f"preconditioner.cg_maxiter={cg_maxiter}"])


def over_chunks(chunks, run):
    """`run(chunk_size value)` for each of `chunks` ("none" -> null), progress on stderr.

    Returns:
        (rows of (chunk, peak RSS, s / step, wall) for `print_table`, the case's n_params).
    """
    rows, n_params = [], None
    for chunk in chunks:
        rss, per_step, wall, n_params = run("null" if chunk == "none" else chunk)
        rows.append((chunk, rss, per_step, wall))
        print(f"chunk_size={chunk}: peak RSS {rss:.0f} MiB, {per_step:.2f} s/step", file=sys.stderr, flush=True)
    return rows, n_params


def print_table(rows):
    """The markdown table of (chunk_size, peak RSS, s / step, wall) rows."""
    print("| chunk_size | peak RSS (MiB) | s / step | process wall (s) |")
    print("|---|---|---|---|")
    for chunk, rss, per_step, wall in rows:
        print(f"| {chunk} | {rss:.0f} | {per_step:.2f} | {wall:.0f} |")


def machine():
    import jax

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores; Python {platform.python_version()}, jax {jax.__version__}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", nargs="+", default=["none", "2048", "512", "128"])
    parser.add_argument("--n-iter", type=int, default=4)
    parser.add_argument("--cg-maxiter", type=int, default=20,
                        help="caps CG's iterations so every setting does the same work per step")
    args = parser.parse_args()
    rows, n_params = over_chunks(args.chunks, lambda chunk: run_one(chunk, args.n_iter, args.cg_maxiter))
    print(f"Peak memory against `chunk_size`: RBM alpha=10 on a 100-site Ising chain ({n_params:,} real "
          f"parameters), 4,096 samples in 16 chains, SR by CG (at most {args.cg_maxiter} iterations a step), "
          f"{args.n_iter} steps, one fresh process per setting. Machine: {machine()}.\n")
    print_table(rows)


if __name__ == "__main__":
    main()
