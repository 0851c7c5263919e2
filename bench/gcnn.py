#!/usr/bin/env python
"""The same GCNN in vmc-runner and NetKet, side by side: time per iteration on the 6 x 6 triangular lattice.

The case `gcnn_tri6` of bench/run.py: Heisenberg antiferromagnet on the 6 x 6 triangular torus
(Sz = 0, no sign rule), a complex GCNN over the space group (36 translations x C6v, 432
elements), features [8, 8] (an embedding and one group convolution), log_cosh activations,
Metropolis exchange of nearest neighbours, 16 chains, 512 samples, SGD 0.01, SR with diag_shift
0.01 in sample space: vmc-runner's `minsr` (Cholesky), NetKet's `VMC_SR` (its NTK form, chosen
by NetKet, cholesky_with_fallback) and, for NetKet at its best, `VMC` + `SR` (CG). Both codes
convolve by FFT over the translations.

Timing, process settings and the interleaving are bench/run.py's: wall time of the steps after the
first 10 divided by their number (14 steps: 4 timed); runs alternate A B C C B A over seeds. The
final estimate takes one round of samples (NetKet's of 8 rounds peaks at 16 GB).

    python bench/gcnn.py --netket-python /work/nkvenv/bin/python --seeds 0 1 --write docs/benchmarks.md
"""

import argparse
import datetime
import os
import platform
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as bench  # noqa: E402  (bench/run.py)

CASE = "gcnn_tri6"
START = "<!-- bench/gcnn.py: start (generated; rerun to replace) -->"
END = "<!-- bench/gcnn.py: end -->"
SIDES = {"vmc": "vmc-runner (minsr)", "nk_dense": "NetKet VMC_SR (NTK)", "nk_cg": "NetKet VMC + SR (CG)"}


def measure(seeds, netket_python, n_iter=None):
    """{side: [run, ...]}, one run per seed and side, interleaved."""
    env = bench.process_env()
    runs = {side: [] for side in SIDES}
    for rep, seed in enumerate(seeds):
        for side in (list(SIDES) if rep % 2 == 0 else list(SIDES)[::-1]):
            if side == "vmc":
                run = bench.run_vmc_runner(CASE, bench.SIZES[CASE], seed=seed, n_iter=n_iter, env=env)
            else:
                run = bench.run_netket(CASE, netket_python, bench.SIZES[CASE], seed=seed,
                                       driver=bench.NETKET_DRIVERS[side], n_iter=n_iter, env=env)
            runs[side].append(run)
            print(f"{CASE} seed {seed} {SIDES[side]} {run['s_per_iter']:.3f} s/iter", file=sys.stderr)
    return runs


def render(runs, args):
    """The markdown section (no `## ` headings)."""
    import jax

    cpu = bench.cpu_name()
    med = {side: statistics.median(r["s_per_iter"] for r in side_runs) for side, side_runs in runs.items()}
    best = min(("nk_dense", "nk_cg"), key=med.get)
    command = "python bench/gcnn.py --seeds " + " ".join(map(str, args.seeds)) + (
        f" --n-iter {args.n_iter}" if args.n_iter else "")
    lines = [f"Measured {datetime.date.today()} with `{command}` on {os.cpu_count()} CPU cores ({cpu}), Python "
             f"{platform.python_version()}, jax {jax.__version__}, NetKet {runs['nk_dense'][0]['versions']['netket']} "
             f"(its own venv); {bench.case_n_iter(CASE, args.n_iter)} steps per run, the first {bench.WARMUP} untimed.",
             "", "| code | s/iter (median) | per run | compile + 1st iter s | final energy per site (± error) |",
             "|---|---|---|---|---|"]
    n = bench.SIZES[CASE]
    for side, side_runs in runs.items():
        energies = ", ".join(f"{r['energy'] / n:.4f} ± {r['energy_error'] / n:.4f}" for r in side_runs)
        lines.append(f"| {SIDES[side]} | {med[side]:.3f} | {[round(r['s_per_iter'], 3) for r in side_runs]} | "
                     f"{statistics.median(r['compile_first'] for r in side_runs):.1f} | {energies} |")
    lines += ["", f"Ratio, vmc-runner to NetKet at its best ({SIDES[best]}): **{med['vmc'] / med[best]:.2f}**.", ""]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--netket-python", required=True, help="an interpreter with netket 3.23.0")
    parser.add_argument("--n-iter", type=int, default=None, help=f"steps per run (> {bench.WARMUP}); default 14")
    parser.add_argument("--write", default=None, help="markdown file whose bench/gcnn.py section is replaced")
    args = parser.parse_args(argv)
    if not bench.has_netket(args.netket_python):
        parser.error(f"NetKet is not importable by {args.netket_python}")
    section = render(measure(args.seeds, args.netket_python, args.n_iter), args)
    print(section)
    if args.write:
        bench.write_section(args.write, section, START, END)


if __name__ == "__main__":
    main()
