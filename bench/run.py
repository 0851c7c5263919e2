#!/usr/bin/env python
"""Side-by-side benchmark: vmc-runner against NetKet on the same cases, interleaved A B A B.

    python bench/run.py [--seeds 0 1] [--cases tfim1d heis1d tfim2d] [--netket-python PYTHON]
                        [--write docs/benchmarks.md]

Each measurement is a fresh process (so compile time and peak RSS are per run), with the
same physics, sizes, seed, optimizer (SGD 0.01), SR (diag_shift 0.01), 16 chains and 5
discarded samples per chain; one vmc-runner/NetKet pair per seed, the order alternating.
Both final energies are estimated from 8 x n_samples fresh samples; for tfim1d and heis1d both
final wavefunctions are also evaluated exactly (<psi|H|psi>/<psi|psi> over the whole basis,
by vmc-runner's code for both, in this process after the timed ones have exited). vmc-runner's time per iteration is the median of the step
durations after 10 warm-up steps, read from metrics.jsonl (it includes the logging).
NetKet runs through bench/netket_cases.py in the interpreter given by --netket-python
(default: this one); without NetKet its columns say so.
"""

import argparse
import datetime
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WARMUP = 10
COMMON = ["sampler.n_chains=16", "sampler.n_discard_per_chain=5", "optimizer=sgd", "optimizer.learning_rate=0.01",
          "preconditioner=sr", "preconditioner.diag_shift=0.01", "exact=false", "final_rounds=8",
          "checkpoint_every=100000"]
CASES = {
    "tfim1d": ["dtype=float64", "hilbert=chain", "hilbert.L=20", "hamiltonian=ising", "hamiltonian.h=1.0", "model=rbm", "model.alpha=1",
               "sampler=metropolis_local", "sampler.n_samples=1024", "n_iter=300"],
    "heis1d": ["hilbert=chain", "hilbert.L=16", "hilbert.total_sz=0", "hamiltonian=heisenberg", "model=rbm",
               "model.alpha=2", "dtype=complex128", "sampler=metropolis_exchange", "sampler.n_samples=1024", "n_iter=300"],
    "tfim2d": ["dtype=float64", "hilbert=square", "hilbert.L=6", "hamiltonian=ising", "hamiltonian.h=3.0", "model=rbm", "model.alpha=1",
               "sampler=metropolis_local", "sampler.n_samples=2048", "n_iter=150"],
}


PEAK_WRAPPER = (
    "import os, resource, subprocess, sys; "
    "p = subprocess.Popen(sys.argv[1:]); _, status, ru = os.wait4(p.pid, 0); "
    "sys.stderr.write('\\nPEAK_RSS_KB %d\\n' % ru.ru_maxrss); sys.exit(os.waitstatus_to_exitcode(status))"
)


def measured(cmd, cwd):
    """Runs cmd in a wrapper that reports the child's own peak RSS; returns (out, err, MB)."""
    proc = subprocess.run([sys.executable, "-c", PEAK_WRAPPER, *cmd], cwd=cwd, capture_output=True, text=True)
    out, err = proc.stdout, proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:4]} failed ({proc.returncode}):\n{err[-3000:]}")
    peak = [int(line.split()[1]) for line in err.splitlines() if line.startswith("PEAK_RSS_KB")][-1]
    return out, err, peak / 1024


def reference_energy(case):
    if case == "tfim2d":
        return None
    sys.path.insert(0, str(REPO))
    from runner import exact, hilbert, operators

    if case == "tfim1d":
        h = hilbert.chain(20)
        return exact.ground_energy(operators.ising(h, 1.0, 1.0), h)
    h = hilbert.chain(16, total_sz=0)
    return exact.ground_energy(operators.heisenberg(h, 1.0, 0.0, None), h)


EXACT_STATE_CASES = ("tfim1d", "heis1d")  # spaces small enough to sum over exactly


@functools.cache
def experiment(case):
    """vmc-runner's experiment for a case (Hilbert space, Hamiltonian, model), as the runs build it."""
    sys.path.insert(0, str(REPO))
    import jax
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from runner.build import build

    jax.config.update("jax_enable_x64", True)
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*CASES[case], *COMMON])
    return build(OmegaConf.to_container(cfg, resolve=True))


def our_final_params(case, run_dir):
    """The model parameters of a run's final checkpoint, read by the runner's own loader into
    the structure of the case's initial state."""
    import jax
    import jax.numpy as jnp

    from runner import checkpoint, vmc

    ex = experiment(case)
    sigma_N = jnp.ones((ex.hilbert.n_sites,), jnp.int8)
    like = jax.eval_shape(lambda: vmc.init_state(ex.problem, 0, sigma_N))
    state, _ = checkpoint.load(Path(run_dir) / "checkpoint", like)
    return state.params


def exact_state_energy(case, params, chunk=2**16):
    """<psi|H|psi> / <psi|psi> of the RBM with these parameters, summed over the whole basis:
    the final wavefunction's true energy, without the sampling noise of the final estimate.
    NetKet's RBM is the same function of its parameters (kernel, bias -> hidden_bias,
    visible_bias), so both codes' final states are evaluated by this one function."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from runner import exact, hilbert

    ex = experiment(case)
    states = hilbert.all_states(ex.hilbert)
    logpsi = jax.jit(ex.problem.logpsi)
    params = jax.tree_util.tree_map(jnp.asarray, params)
    log_D = np.concatenate([np.asarray(logpsi(params, jnp.asarray(states[i:i + chunk])))
                            for i in range(0, len(states), chunk)])
    return exact.energy_of(ex.hamiltonian, ex.hilbert, np.exp(log_D - log_D.real.max()))


def run_vmc_runner(case, n_sites, extra=(), seed=0):
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "runner", *CASES[case], *COMMON, f"seed={seed}", *extra, f"hydra.run.dir={tmp}"]
        _, _, peak = measured(cmd, REPO)
        summary = json.loads((Path(tmp) / "summary.json").read_text())
        wall = [json.loads(l)["wall_time"] for l in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
        state_energy = exact_state_energy(case, our_final_params(case, tmp)) if case in EXACT_STATE_CASES else None
    steps = [b - a for a, b in zip(wall, wall[1:])][WARMUP:]
    return {"s_per_iter": statistics.median(steps), "compile_first": summary["compile_seconds"] + summary["first_step_seconds"],
            "energy": summary["energy"], "energy_error": summary["energy_error"], "peak_rss_mb": peak, "seed": seed,
            "n_params": summary["n_params"], "e_per_site": summary["energy"] / n_sites, "state_energy": state_energy}


def run_netket(case, python, n_sites, seed=0):
    with tempfile.TemporaryDirectory() as tmp:
        params_file = Path(tmp) / "params.npz"
        cmd = [python, str(REPO / "bench" / "netket_cases.py"), case, f"--seed={seed}", "--final-rounds=8",
               f"--save-params={params_file}"]
        out, _, peak = measured(cmd, REPO)
        result = json.loads(out.strip().splitlines()[-1])
        if case in EXACT_STATE_CASES:
            import numpy as np

            with np.load(params_file) as data:
                state_energy = exact_state_energy(case, {k: data[k] for k in data.files})
        else:
            state_energy = None
    return {"s_per_iter": result["median_s_per_iter"], "compile_first": result["compile_plus_first_iter_s"],
            "energy": result["final_energy"], "energy_error": result["final_energy_error"],
            "peak_rss_mb": peak, "versions": result.get("versions"), "seed": seed, "raw": result,
            "state_energy": state_energy}


def has_netket(python):
    try:
        return subprocess.run([python, "-c", "import netket"], capture_output=True).returncode == 0
    except OSError:  # no such interpreter
        return False


def fmt(x, spec):
    return "—" if x is None else format(x, spec)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1],
                        help="one interleaved vmc-runner/NetKet pair per seed")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--netket-python", default=sys.executable)
    parser.add_argument("--write", default=None, help="write the markdown table here")
    parser.add_argument("--layouts", action="store_true",
                        help="instead: parallel=single against parallel=sharded parallel.cpu_devices=2")
    args = parser.parse_args(argv)
    if args.layouts:
        return compare_layouts(args)
    netket = has_netket(args.netket_python)
    if not netket:
        print(f"NetKet is not importable by {args.netket_python}: install the bench extra "
              "(pip install -e '.[bench]') or pass --netket-python; measuring vmc-runner alone", file=sys.stderr)
    sizes = {"tfim1d": 20, "heis1d": 16, "tfim2d": 36}
    rows = []
    for case in args.cases:
        exact_energy = reference_energy(case)
        ours, theirs = [], []
        for rep, seed in enumerate(args.seeds):
            order = ["nk", "vmc"] if rep % 2 == 0 else ["vmc", "nk"]
            for who in order:
                if who == "vmc":
                    ours.append(run_vmc_runner(case, sizes[case], seed=seed))
                    print(f"{case} seed {seed} vmc-runner {ours[-1]['s_per_iter'] * 1e3:.1f} ms/iter", file=sys.stderr)
                elif netket:
                    theirs.append(run_netket(case, args.netket_python, sizes[case], seed=seed))
                    print(f"{case} seed {seed} netket {theirs[-1]['s_per_iter'] * 1e3:.1f} ms/iter", file=sys.stderr)
        rows.append(summarise(case, ours, theirs, exact_energy, sizes[case]))
    table = render(rows, netket, args)
    print(table)
    if args.write:
        Path(args.write).write_text(table)


def compare_layouts(args):
    """One device against two virtual CPU devices, interleaved; same seed, same numbers."""
    sizes = {"tfim1d": 20, "heis1d": 16, "tfim2d": 36}
    layouts = {"single": ["parallel=single"], "sharded x2": ["parallel=sharded", "parallel.cpu_devices=2"]}
    lines = ["| case | single s/iter | sharded (2 CPU devices) s/iter | ratio | same final energy |", "|---|---|---|---|---|"]
    for case in args.cases:
        runs = {name: [] for name in layouts}
        for rep, seed in enumerate(args.seeds):
            for name in (list(layouts) if rep % 2 == 0 else list(layouts)[::-1]):
                runs[name].append(run_vmc_runner(case, sizes[case], layouts[name], seed=seed))
                print(f"{case} rep {rep} {name} {runs[name][-1]['s_per_iter'] * 1e3:.1f} ms/iter", file=sys.stderr)
        one, two = (statistics.median(r["s_per_iter"] for r in runs[n]) for n in layouts)
        same = all(a["energy"] == b["energy"] or abs(a["energy"] - b["energy"]) < 1e-10 * abs(a["energy"])
                   for a, b in zip(runs["single"], runs["sharded x2"]))
        lines.append(f"| {case} | {one:.4f} | {two:.4f} | {two / one:.2f} | {same} |")
    print("\n".join(lines))


def summarise(case, ours, theirs, exact_energy, n_sites):
    def med(runs, key):
        return statistics.median(r[key] for r in runs) if runs else None

    def accuracy(runs):
        """Mean over seeds of the relative error (or of E/N), and the mean error bar on it."""
        if not runs:
            return None, None
        scale = abs(exact_energy) if exact_energy else n_sites
        value = statistics.mean(abs(r["energy"] - exact_energy) / scale if exact_energy else r["energy"] / scale
                                for r in runs)
        return value, statistics.mean(r["energy_error"] / scale for r in runs)

    row = {"case": case, "exact": exact_energy}
    for side, runs in (("vmc", ours), ("nk", theirs)):
        row[side] = {k: med(runs, k) for k in ("s_per_iter", "compile_first", "peak_rss_mb")}
        row[side]["accuracy"], row[side]["accuracy_error"] = accuracy(runs)
        row[side]["all_s_per_iter"] = [r["s_per_iter"] for r in runs]
        row[side]["all_energies"] = [(r["seed"], r["energy"], r["energy_error"]) for r in runs]
        if exact_energy and runs and all(r.get("state_energy") is not None for r in runs):
            row[side]["state_accuracy"] = statistics.mean(abs(r["state_energy"] - exact_energy) / abs(exact_energy)
                                                          for r in runs)
            row[side]["all_state_energies"] = [(r["seed"], r["state_energy"]) for r in runs]
    row["ratio"] = row["vmc"]["s_per_iter"] / row["nk"]["s_per_iter"] if theirs else None
    row["paired"] = paired_difference(ours, theirs)
    row["paired_state"] = paired_difference(ours, theirs, key="state_energy")
    return row


def paired_difference(ours, theirs, key="energy"):
    """Mean over seeds of E_ours - E_NetKet (same seed) and the standard error of that mean
    from the seed-to-seed spread, or None with fewer than two common seeds."""
    theirs_by_seed = {r["seed"]: r.get(key) for r in theirs}
    diffs = [r[key] - theirs_by_seed[r["seed"]] for r in ours
             if r.get(key) is not None and theirs_by_seed.get(r["seed"]) is not None]
    if len(diffs) < 2:
        return None
    return statistics.mean(diffs), statistics.stdev(diffs) / len(diffs) ** 0.5, len(diffs)


def render(rows, netket, args):
    import jax

    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor()
    lines = [
        "# Benchmarks: vmc-runner against NetKet, side by side",
        "",
        f"Measured {datetime.date.today()} with `python bench/run.py --seeds {' '.join(map(str, args.seeds))}` on {os.cpu_count()} CPU cores "
        f"({cpu}), Python {platform.python_version()}, jax {jax.__version__}"
        + (", NetKet 3.23.0 (its own venv)" if netket else ", NetKet not installed") + ".",
        "Times are medians over the runs (one per seed; runs alternate A B B A). Accuracy is the mean",
        "over seeds of the relative error of the final energy (8 x n_samples fresh samples, both codes)",
        "against exact diagonalisation, or of E/N for tfim2d (lower is better), with the mean",
        "statistical error bar of one estimate after the ±.",
        "",
        "| case | vmc-runner s/iter | NetKet s/iter | ratio | compile + 1st iter (ours / NetKet) | accuracy (ours / NetKet) | peak RSS MB (ours / NetKet) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        v, n = r["vmc"], r["nk"]
        acc_fmt = ".2e" if r["exact"] else ".5f"
        lines.append(
            f"| {r['case']} | {fmt(v['s_per_iter'], '.4f')} | {fmt(n['s_per_iter'], '.4f')} | {fmt(r['ratio'], '.2f')} | "
            f"{fmt(v['compile_first'], '.1f')} s / {fmt(n['compile_first'], '.1f')} s | "
            f"{fmt(v['accuracy'], acc_fmt)} ± {fmt(v['accuracy_error'], '.1e')} / "
            f"{fmt(n['accuracy'], acc_fmt)} ± {fmt(n['accuracy_error'], '.1e')} | "
            f"{fmt(v['peak_rss_mb'], '.0f')} / {fmt(n['peak_rss_mb'], '.0f')} |"
        )
    lines += ["", "Per-run s/iter: " + "; ".join(
        f"{r['case']}: ours {[round(x, 4) for x in r['vmc']['all_s_per_iter']]}, NetKet {[round(x, 4) for x in r['nk']['all_s_per_iter']]}"
        for r in rows), "", "Per-run final energies (seed, E, error bar): " + "; ".join(
        f"{r['case']}: ours {[(s, round(e, 6), round(d, 6)) for s, e, d in r['vmc']['all_energies']]}, "
        f"NetKet {[(s, round(e, 6), round(d, 6)) for s, e, d in r['nk']['all_energies']]}"
        for r in rows), ""]
    paired = [f"{r['case']} {r['paired'][0]:+.4f} ± {r['paired'][1]:.4f} ({r['paired'][2]} seeds)" for r in rows if r["paired"]]
    if paired:
        lines += ["Final energy, ours − NetKet at the same seed (mean ± standard error over seeds; negative: "
                  "ours lower): " + "; ".join(paired), ""]
    exact_rows = [r for r in rows if r["vmc"].get("state_accuracy") is not None]
    if exact_rows:
        lines += ["Exact energy of the final wavefunction, <psi|H|psi>/<psi|psi> summed over the whole basis "
                  "(no sampling noise; NetKet's final parameters evaluated by the same code):", "",
                  "| case | relative error, ours | relative error, NetKet | ours − NetKet at the same seed |",
                  "|---|---|---|---|"]
        for r in exact_rows:
            p = r["paired_state"]
            lines.append(f"| {r['case']} | {r['vmc']['state_accuracy']:.2e} | {fmt(r['nk'].get('state_accuracy'), '.2e')} | "
                         + (f"{p[0]:+.5f} ± {p[1]:.5f} ({p[2]} seeds) |" if p else "— |"))
        lines += ["", "Per-run exact final-state energies (seed, E): " + "; ".join(
            f"{r['case']}: ours {[(s, round(e, 6)) for s, e in r['vmc']['all_state_energies']]}, "
            f"NetKet {[(s, round(e, 6)) for s, e in r['nk'].get('all_state_energies', [])]}" for r in exact_rows), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
