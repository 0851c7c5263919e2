"""Peak memory of every shipped recipe (conf/experiment/) with the default memory budget.

Each recipe runs `python -m runner experiment=NAME` shortened to a few steps (`n_iter`, or
`task.t_end` for a time evolution; everything else as shipped, the exact references included)
in a fresh process; the peak resident memory (ru_maxrss from wait4) counts compilation and
running. With `--budget null` the automatic chunks are off (the runner before memory_budget).
Prints a markdown table with the machine and versions:

    python bench/recipe_memory.py [--budget 1.0] [--only NAME ...]
"""

import argparse
import os
import platform
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from memory import fresh_process  # noqa: E402
# What each recipe needs beyond its own config to run at all, and how it is shortened.
NEEDS = {"tfim_quench_1d": None}  # evolves a ground state from init_from: a run of its own first, left out
SHORT = ["n_iter=3", "final_rounds=1", "checkpoint_every=100000"]
SHORT_DYNAMICS = ["task.t_end=0.2", "task.save_every=0.1"]


def recipes():
    return sorted(p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml") if NEEDS.get(p.stem, 0) is not None)


def is_dynamics(name):
    return "override /task: dynamics" in (REPO / "conf" / "experiment" / f"{name}.yaml").read_text()


def measure(name, budget):
    """(peak RSS in MiB, the chunk the log names or None, wall seconds) of the shortened recipe."""
    short = SHORT_DYNAMICS if is_dynamics(name) else SHORT
    with tempfile.TemporaryDirectory() as tmp:
        out, rss, wall = fresh_process(REPO, [f"experiment={name}", *short, f"memory_budget={budget}",
                                              f"hydra.run.dir={tmp}"])
    chunk = next((line.split("samples evaluated ")[1].split()[0] for line in out.splitlines()
                  if "samples evaluated " in line), None)
    return rss, chunk, wall


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="1.0", help="memory_budget in GiB, or null")
    parser.add_argument("--only", nargs="+", default=None)
    args = parser.parse_args()
    import jax

    print(f"{platform.node()}: {os.cpu_count()} CPUs, Python {platform.python_version()}, jax {jax.__version__}; "
          f"memory_budget={args.budget}")
    print("\n| recipe | chunk | peak RSS (MiB) | wall (s) |\n|---|---|---|---|")
    for name in args.only or recipes():
        rss, chunk, wall = measure(name, args.budget)
        print(f"| {name} | {chunk or 'all'} | {rss:.0f} | {wall:.0f} |", flush=True)


if __name__ == "__main__":
    main()
