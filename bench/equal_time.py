#!/usr/bin/env python
"""Equal wall-clock time: vmc-runner's research recipes against NetKet on 6 x 6 lattices, the energy each reaches.

Both codes get the same wall-clock budget (default 1800 s) on the same problem, interleaved (per problem
and seed: ours then NetKet's, reversed for the next seed), under the same process settings
(bench/run.py's `process_env`). The budget runs from just before each process is started, so start-up
and compilation are inside it; each final estimate is outside it.

- vmc-runner: `python -m runner <recipe overrides>` with a step count never reached (`OURS` below), stopped by SIGTERM
  at the deadline (the runner finishes the step in progress, checkpoints and exits "preempted"); then
  `python -m runner.evaluate RUN_DIR sampler.n_samples=<final samples>` measures the checkpoint's
  energy from fresh samples (8 x the recipe's samples per step by default).
- NetKet 3.23 (bench/netket_equal_time.py, its own venv): a complex GCNN over the translations,
  Metropolis exchange on the lattice graph, `VMC_SR` with diag_shift 0.01, the same samples per step
  and the same basis (phase prior) as ours; a callback stops it at the first step boundary after the
  deadline, then `MCState.expect` on as many fresh samples as our final estimate. Its learning rate is
  scanned (`--netket-lrs`): by default every value gets the whole budget and the lowest final energy
  is NetKet's result (fairer to NetKet than a short scan, which favours rates that are fast at first,
  and it cannot be beaten by our choice of its rate; its selection of the best of several noisy
  estimates biases NetKet's number down, against our claim). With `--scan-budget S` each rate gets S
  seconds instead (lowest mean energy over the last fifth of its steps), and the best rate is then run
  again with the whole budget; the scan's time is reported separately.

Problems (exact energies in Pauli units, H = sum_<ij> XX + YY + ZZ, Sz = 0): `tri6`, the triangular
6 x 6 torus, E0 = -80.693770; `j1j2_6`, the square 6 x 6 torus at J2/J1 = 0.5, E0 = -72.548590.
`--check-operators` checks on small lattices (triangular 3x3 at Sz = 1/2, 3x6 and 4x4, J1-J2 square 4x4)
that the two codes' operators, as configured here, have the same ground energy, and on 6 x 6 the same
number of bonds.

The full run (about 2 hours per problem and seed with three NetKet rates; the CPU must be idle):

    python bench/equal_time.py --seeds 0 --netket-python /work/nkvenv/bin/python --write docs/benchmarks.md

A quick check of the whole pipeline (prints; writes the JSON results only):

    python bench/equal_time.py --budget 60 --problems j1j2_6 --seeds 0 --netket-lrs 0.01 \\
        --netket-python /work/nkvenv/bin/python
"""

import argparse
import datetime
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as bench  # noqa: E402  (bench/run.py: process_env, process_settings, write_section, cpu_name)

REPO = bench.REPO
# vmc-runner's side: the research-size recipes (docs/physics.md, docs/notes/research-sizes.md), as typed, with a step
# count the budget never reaches (the SIGTERM stops it; on 6 x 6 the recipe's Monte Carlo set-up holds its n_iter).
OURS = {
    "tri6": ["experiment=triangular_heisenberg", "hilbert.L=6", "observables=none", "monte_carlo.n_iter=1000000"],
    "j1j2_6": ["experiment=j1j2_square_cnn", "observables=none", "n_iter=1000000"],
}
EXACT = {"tri6": -80.693770, "j1j2_6": -72.548590}
N_SITES = {"tri6": 36, "j1j2_6": 36}
NETKET_LRS = [0.005, 0.01, 0.02]
FINAL_ROUNDS = 8  # the final estimate: FINAL_ROUNDS x the recipe's samples per step, both codes
STOP_GRACE = 900  # seconds a stopped process may take to finish its step and checkpoint before it is killed
START = "<!-- bench/equal_time.py: start (generated; rerun to replace) -->"
END = "<!-- bench/equal_time.py: end -->"
# The operator check: (problem, Hydra overrides of the small lattice, the NetKet script's key).
CHECKS = [
    ("tri6", ["hilbert.L=3", "hilbert.total_sz=0.5"], "tri6 3x3 sz=0.5"),
    ("tri6", ["hilbert.L=null", "hilbert.Lx=3", "hilbert.Ly=6"], "tri6 3x6 sz=0.0"),
    ("tri6", ["hilbert.L=4"], "tri6 4x4 sz=0.0"),
    ("j1j2_6", ["hilbert.L=4"], "j1j2_6 4x4 sz=0.0"),
]


def composed(overrides) -> dict:
    """vmc-runner's config for `overrides`, as `python -m runner` runs it (plain dict; a recipe's Monte Carlo
    set-up applied where the space is beyond its reach)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from runner.config import monte_carlo
    from runner.config.build import instantiate

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = OmegaConf.to_container(compose(config_name="config", overrides=list(overrides)), resolve=True)
    return monte_carlo.resolve(cfg, instantiate, overrides)


def our_operator(overrides):
    """(Hilbert space, Hamiltonian, the Hamiltonian's config node) of vmc-runner for `overrides`."""
    from runner.config.build import instantiate

    cfg = composed(overrides)
    hilbert = instantiate("hilbert", cfg["hilbert"])
    return hilbert, instantiate("hamiltonian", cfg["hamiltonian"], hilbert=hilbert), cfg["hamiltonian"]


def recipe_samples(problem) -> int:
    """Samples per step of our recipe on 6 x 6."""
    return int(composed(OURS[problem])["sampler"]["n_samples"])


def check_operators(netket_python, env) -> bool:
    """Ground energies of both codes' operators on small lattices, and the 6 x 6 bond counts; prints a table."""
    from runner.physics import exact

    out = subprocess.run([netket_python, str(REPO / "bench" / "netket_equal_time.py"), "--exact-energies"],
                         cwd=REPO, env=env, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"netket_equal_time.py --exact-energies failed:\n{out.stderr[-3000:]}")
    theirs = json.loads(out.stdout.strip().splitlines()[-1])
    ok = True
    print("| lattice | vmc-runner H | E0 vmc-runner | E0 NetKet (our basis) | E0 NetKet (no prior) | agree |")
    print("|---|---|---|---|---|---|")
    for problem, small, key in CHECKS:
        hilbert, ham, node = our_operator([*OURS[problem], *small])
        ours = exact.ground_energy(ham, hilbert)
        native, plain = theirs[f"{key} prior=native"], theirs[f"{key} prior=none"]
        agree = abs(ours - native) < 1e-8 and abs(ours - plain) < 1e-8
        ok &= agree
        h = ", ".join(f"{k}={node[k]}" for k in ("J", "J2", "phase_prior") if k in node)
        print(f"| {key} | {h} | {ours:.10f} | {native:.10f} | {plain:.10f} | {agree} |")
    for problem in OURS:
        hilbert, _, _ = our_operator(OURS[problem])
        ours = [len(hilbert.bonds)] + ([len(hilbert.next_bonds)] if problem == "j1j2_6" else [])
        agree = ours == theirs[f"{problem} bonds per colour"]
        ok &= agree
        nk_bonds = theirs[f"{problem} bonds per colour"]
        print(f"| {problem} 6x6 bonds (nearest, next) | | {ours} | {nk_bonds} | | {agree} |")
    return ok


def run_ours(problem, seed, budget, env, work: Path, final_samples):
    """One budgeted run of ours and its evaluation; returns the result dict."""
    run_dir = work / f"ours_{problem}_seed{seed}"
    cmd = [sys.executable, "-m", "runner", *OURS[problem], f"seed={seed}", f"hydra.run.dir={run_dir}"]
    log = open(work / f"ours_{problem}_seed{seed}.log", "w")
    start = time.time()
    deadline = start + budget
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        proc.wait(timeout=budget)
        signalled = None
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        signalled = time.time() - deadline
        try:
            proc.wait(timeout=STOP_GRACE)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    exited = time.time() - deadline
    log.close()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    summary_file = run_dir / "summary.json"
    status = json.loads(summary_file.read_text()).get("status") if summary_file.is_file() else None
    if signalled is None or proc.returncode not in (0, 3):
        raise RuntimeError(f"our {problem} run ended with status {proc.returncode} "
                           f"({'before' if signalled is None else 'after'} its deadline); see {log.name} in {work}")
    t_eval = time.time()
    ev = subprocess.run([sys.executable, "-m", "runner.evaluate", str(run_dir), f"sampler.n_samples={final_samples}"],
                        cwd=REPO, env=env, capture_output=True, text=True)
    if ev.returncode:
        raise RuntimeError(f"runner.evaluate {run_dir} failed:\n{ev.stderr[-3000:]}")
    evaluation = json.loads((run_dir / "evaluation.json").read_text())
    energy, error = evaluation["energy"], evaluation["energy_error"]
    return {"code": "vmc-runner", "problem": problem, "seed": seed, "budget": budget, "run_dir": str(run_dir),
            "command": " ".join(["python -m runner", *OURS[problem], f"seed={seed}"]),
            "steps": len(records), "checkpoint_step": evaluation["step"], "status": status,
            "signal_after_deadline_s": signalled, "exit_after_deadline_s": exited,
            "energies": [r.get("energy") for r in records],
            "energy": energy, "energy_error": error, "final_samples": evaluation["total_samples"],
            "v_score": evaluation.get("v_score"), "r_hat": evaluation.get("r_hat"),
            "final_seconds": time.time() - t_eval,
            "relative_error": abs((energy - EXACT[problem]) / EXACT[problem])}


def run_netket(problem, seed, budget, lr, env, python, final_samples, extra=()):
    """One budgeted NetKet run (bench/netket_equal_time.py) with its final estimate; returns its JSON."""
    deadline = time.time() + budget
    cmd = [python, str(REPO / "bench" / "netket_equal_time.py"), problem, f"--deadline={deadline!r}", f"--lr={lr}",
           f"--seed={seed}", f"--n-samples={final_samples // FINAL_ROUNDS}", f"--final-samples={final_samples}", *extra]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=budget + 2 * STOP_GRACE)
    if proc.returncode:
        raise RuntimeError(f"NetKet {problem} lr={lr} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if bench.process_settings(result["env"]) != bench.process_settings(env):
        raise RuntimeError(f"NetKet ran with {bench.process_settings(result['env'])}, "
                           f"not {bench.process_settings(env)}")
    energy = result["final_energy"]
    return {**result, "code": "NetKet", "budget": budget, "energy": energy,
            "energy_error": result["final_energy_error"],
            "exit_after_deadline_s": result["stopped"]}


def tail_energy(result, fraction=0.2) -> float:
    """Mean training energy over the last `fraction` of a run's steps (the short scan's criterion)."""
    e = result["energies"]
    return sum(e[-max(1, int(len(e) * fraction)):]) / max(1, int(len(e) * fraction))


def netket_side(problem, seed, args, env, final_samples):
    """NetKet's learning-rate scan and its result: (best run, [scan runs])."""
    if args.scan_budget is None:
        runs = [run_netket(problem, seed, args.budget, lr, env, args.netket_python, final_samples, args.netket_args)
                for lr in args.netket_lrs]
        for r in runs:
            _report(r)
        return min(runs, key=lambda r: r["energy"]), runs
    scan = [run_netket(problem, seed, args.scan_budget, lr, env, args.netket_python, final_samples, args.netket_args)
            for lr in args.netket_lrs]
    for r in scan:
        _report(r, "scan")
    best_lr = min(scan, key=tail_energy)["lr"]
    best = run_netket(problem, seed, args.budget, best_lr, env, args.netket_python, final_samples, args.netket_args)
    _report(best)
    return best, scan


def _report(r, what="run"):
    print(f"{r['problem']} seed {r['seed']} {r['code']} {what}{' lr=' + str(r['lr']) if 'lr' in r else ''}: "
          f"{r['steps']} steps, E = {r['energy']:.5f} ± {r['energy_error']:.5f} "
          f"(relative error {r['relative_error']:.2e})", file=sys.stderr, flush=True)


def verdict(ours, theirs):
    """(E_NetKet - E_ours, combined error bar, ours lower by more than it)."""
    diff = theirs["energy"] - ours["energy"]
    combined = math.hypot(ours["energy_error"], theirs["energy_error"])
    return diff, combined, diff > combined


def render(results, args, env) -> str:
    """The markdown section (between START and END)."""
    import jax

    cmd = (f"python bench/equal_time.py --budget {args.budget:g} --problems {' '.join(args.problems)} --seeds "
           f"{' '.join(map(str, args.seeds))} --netket-lrs {' '.join(map(str, args.netket_lrs))}"
           + (f" --scan-budget {args.scan_budget:g}" if args.scan_budget is not None else ""))
    nk = next((r["netket"] for r in results), None)
    settings = ", ".join(f"`{k}={v}`" for k, v in bench.process_settings(env).items())
    lines = [
        "## Equal wall-clock time against NetKet (6 × 6)",
        "",
        f"Measured {datetime.date.today()} with `{cmd}` on {os.cpu_count()} CPU cores ({bench.cpu_name()}), "
        f"Python {platform.python_version()}, jax {jax.__version__}"
        + (f", NetKet {nk['versions']['netket']} (its own venv)" if nk else "") + ".",
        "",
        f"Each code gets {args.budget:g} s of wall-clock time from just before its process starts (start-up and "
        "compilation included), then its final estimate outside the budget, from "
        f"{FINAL_ROUNDS} x the recipe's samples per step of fresh samples (ours: `runner.evaluate`; NetKet: "
        "`MCState.expect`). Ours runs the recipe as typed (command below) and is stopped by SIGTERM; NetKet"
        + (f" runs {nk['model']}, Metropolis exchange, {nk['driver']} with diag_shift {nk['diag_shift']}, "
           f"{nk['n_samples']} samples per step from {nk['n_chains']} chains, in our basis (prior "
           f"`{nk['prior']}`), stopped by a callback at the first step after the deadline." if nk else ".")
        + (" NetKet's learning rate: every value of the scan got the whole budget, and its lowest final energy is "
           "NetKet's row (the other values in the last table)." if args.scan_budget is None else
           f" NetKet's learning rate: a scan of {args.scan_budget:g} s per value (not counted in the budget; its time "
           "is in the last table), the best then run afresh with the whole budget.")
        + f" Same process settings for both ({settings}); runs alternate ours, NetKet / NetKet, ours over seeds.",
        "",
        "| problem | seed | code | budget s | steps | energy ± error | relative error | "
        "E(NetKet) − E(ours) | combined error bar | ours lower beyond it |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        o, n = r["ours"], r["netket"]
        diff, combined, lower = verdict(o, n)
        for side, label in ((o, "vmc-runner"), (n, f"NetKet (lr {n['lr']})")):
            lines.append(f"| {r['problem']} | {r['seed']} | {label} | {side['budget']:g} | {side['steps']} | "
                         f"{side['energy']:.4f} ± {side['energy_error']:.4f} | {side['relative_error']:.2e} | "
                         + (f"{diff:+.4f} | {combined:.4f} | **{'yes' if lower else 'no'}** |"
                            if side is o else "| | |"))
    lines += ["", "Exact energies (Pauli units): tri6 -80.693770, j1j2_6 -72.548590. Our commands: "
              + "; ".join(f"`{' '.join(['python -m runner', *OURS[p]])}`" for p in args.problems) + ".", "",
              "NetKet's learning-rate scan:", "",
              "| problem | seed | lr | budget s | steps | final energy ± error | relative error | "
              "mean energy, last fifth of steps |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        for s in r["netket_scan"]:
            lines.append(f"| {r['problem']} | {r['seed']} | {s['lr']} | {s['budget']:g} | {s['steps']} | "
                         f"{s['energy']:.4f} ± {s['energy_error']:.4f} | {s['relative_error']:.2e} | "
                         f"{tail_energy(s):.4f} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, default=1800, help="wall-clock seconds per run (default 1800)")
    parser.add_argument("--problems", nargs="+", default=list(OURS), choices=list(OURS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--netket-python", default="/work/nkvenv/bin/python",
                        help="an interpreter with netket 3.23.0")
    parser.add_argument("--netket-lrs", type=float, nargs="+", default=NETKET_LRS, help="NetKet's learning-rate scan")
    parser.add_argument("--scan-budget", type=float, default=None,
                        help="seconds per scanned rate, the best then rerun with --budget (default: every rate "
                             "gets --budget and the lowest final energy counts)")
    parser.add_argument("--netket-args", nargs=argparse.REMAINDER, default=[],
                        help="passed on to bench/netket_equal_time.py (e.g. --features 8 --symmetries "
                             "space_group); give it last")
    parser.add_argument("--json", default=None, help="results file (default: WORK_DIR/equal_time.json)")
    parser.add_argument("--work-dir", default=None, help="run directories and logs (default: a new temporary one)")
    parser.add_argument("--write", default=None, help="markdown file whose bench/equal_time.py section is replaced")
    parser.add_argument("--check-operators", action="store_true",
                        help="only compare both codes' operators on small lattices (exact ground energies)")
    args = parser.parse_args(argv)
    env = bench.process_env()
    if not bench.has_netket(args.netket_python):
        parser.error(f"NetKet is not importable by {args.netket_python}")
    if args.check_operators:
        sys.exit(0 if check_operators(args.netket_python, env) else 1)

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="equal_time_"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"run directories and logs in {work}", file=sys.stderr)
    results = []
    for problem in args.problems:
        final_samples = FINAL_ROUNDS * recipe_samples(problem)
        for rep, seed in enumerate(args.seeds):
            ours = netket = scan = None
            for side in (("ours", "netket") if rep % 2 == 0 else ("netket", "ours")):
                if side == "ours":
                    ours = run_ours(problem, seed, args.budget, env, work, final_samples)
                    _report(ours)
                else:
                    netket, scan = netket_side(problem, seed, args, env, final_samples)
            results.append({"problem": problem, "seed": seed, "exact": EXACT[problem], "ours": ours, "netket": netket,
                            "netket_scan": scan, "verdict": dict(zip(("difference", "combined_error", "ours_lower"),
                                                                     verdict(ours, netket)))})
            json_path = Path(args.json) if args.json else work / "equal_time.json"
            json_path.write_text(json.dumps({"args": {k: v for k, v in vars(args).items()},
                                             "process_settings": bench.process_settings(env),
                                             "results": results}, indent=1) + "\n")
    section = render(results, args, env)
    print(section)
    print(f"results: {json_path}", file=sys.stderr)
    if args.write:
        bench.write_section(args.write, section, START, END)


if __name__ == "__main__":
    main()
