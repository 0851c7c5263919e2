#!/usr/bin/env python
"""Scaling table: vmc-runner's time per iteration and peak memory against samples, parameters, sites and layout.

Every point is one fresh `python -m runner` process (short runs: --n-iter steps, the first 10
untimed, timed as bench/run.py times them, under its `process_env`); peak RSS is the process's
ru_maxrss (with two processes, the larger of the two). The base case is a periodic transverse-field
Ising chain (h = 1) with an RBM and minSR, float64; one knob varies per block:

    python bench/scaling.py [--n-iter 30] [--blocks samples params sites layouts] [--write docs/benchmarks.md]

On a machine with C cores, more virtual devices than C cannot be faster: the layout rows show what
splitting the chains over devices and processes costs.
"""

import argparse
import datetime
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from run import PEAK_WRAPPER, WARMUP, mean_step_seconds, process_env, write_section, cpu_name  # noqa: E402

BASE = {"L": 32, "alpha": 2, "n_samples": 1024}
COMMON = ["hilbert=chain", "hamiltonian=ising", "hamiltonian.h=1.0", "model=rbm", "dtype=float64",
          "sampler=metropolis_local", "sampler.n_chains=16", "sampler.n_discard_per_chain=5", "optimizer=sgd",
          "optimizer.learning_rate=0.01", "preconditioner=minsr", "preconditioner.diag_shift=0.01", "exact=false",
          "final_rounds=1", "checkpoint_every=100000"]
# Each block varies one knob of the base case (the others stay at BASE).
BLOCKS = {
    "samples": ("n_samples", [512, 1024, 2048, 4096]),
    "params": ("alpha", [1, 2, 4, 8]),
    "sites": ("L", [16, 32, 64, 128]),
    "layouts": ("layout", ["single", "sharded x1", "sharded x2", "sharded x4", "2 processes x1"]),
}
LAYOUTS = {
    "single": ["parallel=single"],
    "sharded x1": ["parallel=sharded", "parallel.cpu_devices=1"],
    "sharded x2": ["parallel=sharded", "parallel.cpu_devices=2"],
    "sharded x4": ["parallel=sharded", "parallel.cpu_devices=4"],
    "2 processes x1": "distributed",
}
SECTION_START = "<!-- bench/scaling.py: start (generated; rerun to replace) -->"
SECTION_END = "<!-- bench/scaling.py: end -->"


def point_overrides(n_iter, L=BASE["L"], alpha=BASE["alpha"], n_samples=BASE["n_samples"]):
    """The Hydra overrides of one point (without the parallel group)."""
    return [*COMMON, f"hilbert.L={L}", f"model.alpha={alpha}", f"sampler.n_samples={n_samples}", f"n_iter={n_iter}"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wrapped(args):
    return [sys.executable, "-c", PEAK_WRAPPER, sys.executable, "-m", "runner", *args]


def _peak_mb(stderr):
    return max(int(line.split()[1]) for line in stderr.splitlines() if line.startswith("PEAK_RSS_KB")) / 1024


def run_point(overrides, layout, env):
    """(s/iter, peak RSS MB, summary) of one run in fresh process(es)."""
    with tempfile.TemporaryDirectory() as tmp:
        if LAYOUTS[layout] == "distributed":
            port = free_port()
            procs = [subprocess.Popen(_wrapped([*overrides, "parallel=distributed",
                                                f"parallel.coordinator_address=127.0.0.1:{port}",
                                                "parallel.num_processes=2", f"parallel.process_id={pid}",
                                                "parallel.cpu_devices=1", f"hydra.run.dir={tmp}"]),
                                      cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                     for pid in range(2)]
            results = [p.communicate() + (p.returncode,) for p in procs]
        else:
            proc = subprocess.run(_wrapped([*overrides, *LAYOUTS[layout], f"hydra.run.dir={tmp}"]), cwd=REPO, env=env,
                                  capture_output=True, text=True)
            results = [(proc.stdout, proc.stderr, proc.returncode)]
        for _, err, code in results:
            if code != 0:
                raise RuntimeError(f"{layout} {overrides[-4:]} failed ({code}):\n{err[-3000:]}")
        summary = json.loads((Path(tmp) / "summary.json").read_text())
        records = [json.loads(line) for line in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
    return mean_step_seconds([r["wall_time"] for r in records], WARMUP), max(_peak_mb(r[1]) for r in results), summary


def machine():
    import jax

    cpu = cpu_name()
    return f"{os.cpu_count()} CPU cores ({cpu}), Python {platform.python_version()}, jax {jax.__version__}"


def render(rows, args):
    command = f"python bench/scaling.py --n-iter {args.n_iter} --blocks {' '.join(args.blocks)}"
    lines = [
        "## Scaling: time per iteration and peak memory against the work",
        "",
        f"Measured {datetime.date.today()} with `{command}` on {machine()}. {args.note}".rstrip(),
        "",
        f"Base case: periodic Ising chain (h = 1), L = {BASE['L']}, RBM alpha = {BASE['alpha']} (float64), "
        f"{BASE['n_samples']} samples in 16 chains (5 discarded sweeps), Metropolis local, minSR (diag_shift 0.01), "
        f"SGD; each row changes one knob. One fresh process per row, {args.n_iter} steps, time per iteration over "
        f"the steps after the first {WARMUP} (as bench/run.py), peak RSS = ru_maxrss of the process (2 processes: "
        "the larger). The layout rows split the same chains over virtual CPU devices (`parallel=sharded "
        "parallel.cpu_devices=k`) or two processes (`parallel=distributed`, one CPU device each) on the same "
        f"{os.cpu_count()} cores: more devices than cores cannot be faster, so these rows show the cost of the "
        "layout itself.",
        "",
        "| varied | value | sites N | parameters P | samples S | layout | s / iter | peak RSS MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for block, value, s_iter, rss, summary, layout in rows:
        if s_iter is None:
            lines.append(f"| {block} | {value} | {summary['n_sites']} | — | — | {layout} | failed: "
                         f"{summary['failed'].replace('|', '/')} | — |")
            continue
        lines.append(f"| {block} | {value} | {summary['n_sites'] if 'n_sites' in summary else '—'} | "
                     f"{summary['n_params']:,} | {summary['n_samples']} | {layout} | {s_iter:.4f} | {rss:.0f} |")
    return "\n".join(lines) + "\n"


def plan(blocks, n_iter):
    """[(block, value, overrides, layout)] of every point, in order."""
    points = []
    for block in blocks:
        knob, values = BLOCKS[block]
        for value in values:
            if knob == "layout":
                points.append((block, value, point_overrides(n_iter), value))
            else:
                points.append((block, value, point_overrides(n_iter, **{knob: value}), "single"))
    return points


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-iter", type=int, default=30)
    parser.add_argument("--blocks", nargs="+", default=list(BLOCKS), choices=list(BLOCKS))
    parser.add_argument("--note", default="", help="a sentence for the docs (e.g. that the machine was shared)")
    parser.add_argument("--write", default=None, help="markdown file whose Scaling section is replaced")
    args = parser.parse_args(argv)
    if args.n_iter <= WARMUP:
        parser.error(f"--n-iter must exceed the {WARMUP} warm-up steps")
    env = process_env()
    rows = []
    for block, value, overrides, layout in plan(args.blocks, args.n_iter):
        L = next(int(o.split("=")[1]) for o in overrides if o.startswith("hilbert.L="))
        try:
            s_iter, rss, summary = run_point(overrides, layout, env)
        except RuntimeError as err:  # recorded, not fatal: the other points still run
            lines = str(err).splitlines()
            reason = next((line for line in lines if "timeout" in line.lower()), lines[0])
            print(f"{block} {value}: failed: {reason}", file=sys.stderr, flush=True)
            rows.append((block, value, None, None, {"n_sites": L, "failed": reason[:200]}, layout))
            continue
        summary = {**summary, "n_sites": L}
        rows.append((block, value, s_iter, rss, summary, layout))
        print(f"{block} {value}: {s_iter * 1e3:.1f} ms/iter, {rss:.0f} MB, P={summary['n_params']}", file=sys.stderr,
              flush=True)
    section = render(rows, args)
    print(section)
    if args.write:
        write_section(args.write, section, SECTION_START, SECTION_END)


if __name__ == "__main__":
    main()
