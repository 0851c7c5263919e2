#!/usr/bin/env python
"""Side-by-side benchmark: vmc-runner against NetKet (two drivers) on the same cases, interleaved.

Final run (writes the side-by-side section of docs/benchmarks.md; about 25-35 min on 2 idle cores,
45 processes of 15-20 s start-up and compilation each plus the steps; longer on a shared machine):

    python bench/run.py --seeds 0 1 2 3 4 --netket-python /work/nkvenv/bin/python --write docs/benchmarks.md

Quick check of the whole pipeline (a few minutes: 9 short processes; prints, writes nothing):

    python bench/run.py --seeds 0 --n-iter 20 --netket-python /work/nkvenv/bin/python

Per case and seed, three fresh processes (so compile time and peak RSS are per run), in the
order vmc-runner, NetKet VMC + SR (CG), NetKet VMC_SR (dense) for even seeds and reversed for
odd ones: the same physics, sizes, seed, samples (16 chains, 5 discarded per chain), optimizer
(SGD 0.01) and SR diag_shift (0.01); NetKet's complex heis1d RBM is declared holomorphic (VMC +
SR; VMC_SR has no holomorphic mode in 3.23). "NetKet at its best" is the faster of its two drivers
(median over seeds). Both processes get the same process settings: this process's environment
with vmc-runner's own `configure_runtime` applied (OPENBLAS_NUM_THREADS, MALLOC_MMAP_MAX_,
MALLOC_TRIM_THRESHOLD_, XLA_FLAGS).

Time per iteration, both codes: the wall time of the steps after the first 10 divided by their
number, with one synchronisation at each end of that interval. vmc-runner: metrics.jsonl
`wall_time` of the last step minus that of step 10 (each record is written after that step's
metrics were copied to the host, which waits for the step). NetKet: bench/netket_cases.py blocks
on the parameters, sampler state and energy after step 10 and after the last step. Both final
energies come from 8 x n_samples fresh samples; for tfim1d and heis1d every final wavefunction is
also evaluated exactly (<psi|H|psi>/<psi|psi> over the whole basis, by vmc-runner's code for
all, in this process after the timed ones have exited). Without NetKet its columns say so.
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
import time
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parent.parent
WARMUP = 10  # steps before the timed interval, both codes
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
SIZES = {"tfim1d": 20, "heis1d": 16, "tfim2d": 36}
RBM_CASES = tuple(CASES)  # the side-by-side table of this script; bench/gcnn.py times the GCNN case
# The GCNN on the 6 x 6 triangular lattice (bench/gcnn.py): more parameters than samples, so SR
# in sample space (minsr), NetKet's VMC_SR choosing the same (its NTK form).
CASES["gcnn_tri6"] = ["hilbert=triangular", "hilbert.L=6", "hilbert.total_sz=0", "hamiltonian=heisenberg", "model=gcnn",
                      "model.features=[8,8]", "dtype=complex128", "sampler=metropolis_exchange",
                      "sampler.n_samples=512", "n_iter=14"]
SIZES["gcnn_tri6"] = 36
PRECONDITIONER = {"gcnn_tri6": "minsr"}  # the others: sr (COMMON)
FINAL_ROUNDS = {"gcnn_tri6": 1}  # the others: 8 (COMMON); NetKet's final estimate of 8 x 512 GCNN samples peaks at 16 GB
# The measured sides: ours, and NetKet's two SR drivers (bench/netket_cases.py --driver).
SIDES = {"vmc": "vmc-runner", "nk_cg": "NetKet VMC + SR (CG)", "nk_dense": "NetKet VMC_SR (dense)"}
NETKET_DRIVERS = {"nk_cg": "vmc", "nk_dense": "vmc_sr"}
SECTION_START = "<!-- bench/run.py side-by-side: start (generated; rerun to replace) -->"
SECTION_END = "<!-- bench/run.py side-by-side: end -->"


PEAK_WRAPPER = (
    "import os, resource, subprocess, sys; "
    "p = subprocess.Popen(sys.argv[1:]); _, status, ru = os.wait4(p.pid, 0); "
    "sys.stderr.write('\\nPEAK_RSS_KB %d\\n' % ru.ru_maxrss); sys.exit(os.waitstatus_to_exitcode(status))"
)


# The environment variables a timed NetKet process reports (bench/netket_cases.py, bench/deep.py),
# compared with ours by `process_settings`: they must include every variable `configure_runtime`
# decides (tests/test_bench.py checks).
REPORTED_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "XLA_FLAGS", "JAX_PLATFORMS",
                "MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_")


def process_env(base=None) -> dict:
    """The environment of every timed process: `base` (default: this process's) with the
    process settings vmc-runner applies to itself (`runner.parallel.runtime.configure_runtime`:
    OPENBLAS_NUM_THREADS, glibc's MALLOC_ settings, XLA:CPU's small-loop threshold in XLA_FLAGS)
    already applied.

    The runner's own call then changes nothing (it only fills in what is unset), so vmc-runner
    and NetKet run under identical settings.
    """
    sys.path.insert(0, str(REPO))
    from runner.parallel.runtime import configure_runtime

    env = dict(os.environ if base is None else base)
    with mock.patch.dict(os.environ, env, clear=True):
        configure_runtime()
        return dict(os.environ)


def process_settings(env) -> dict:
    """The variables `configure_runtime` decides, as they are in `env` (None when unset)."""
    return {k: env.get(k) for k in process_env({})}


def mean_step_seconds(wall_times, warmup=WARMUP) -> float:
    """Mean wall time per step after `warmup` steps: (t[n-1] - t[warmup-1]) / (n - warmup).

    Args:
        wall_times: (n,) wall-clock time at the end of each step, in seconds from any origin
            (metrics.jsonl `wall_time`).
        warmup: steps excluded; the interval starts at the end of step `warmup` (1-based).

    Returns:
        Seconds per step over steps warmup+1..n, every step counted (no median).
    """
    n = len(wall_times)
    if not 1 <= warmup < n:
        raise ValueError(f"need more than {warmup} steps to time, got {n}")
    return (wall_times[-1] - wall_times[warmup - 1]) / (n - warmup)


def measured(cmd, cwd, env):
    """Runs cmd in a wrapper that reports the child's own peak RSS; returns (out, err, MB)."""
    proc = subprocess.run([sys.executable, "-c", PEAK_WRAPPER, *cmd], cwd=cwd, capture_output=True, text=True,
                          env=env)
    out, err = proc.stdout, proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:4]} failed ({proc.returncode}):\n{err[-3000:]}")
    peak = [int(line.split()[1]) for line in err.splitlines() if line.startswith("PEAK_RSS_KB")][-1]
    return out, err, peak / 1024


def reference_energy(case):
    if case == "tfim2d":
        return None
    sys.path.insert(0, str(REPO))
    from runner.physics import exact, hamiltonians, hilbert

    if case == "tfim1d":
        h = hilbert.chain(20)
        return exact.ground_energy(hamiltonians.ising(h, 1.0, 1.0), h)
    h = hilbert.chain(16, total_sz=0)
    return exact.ground_energy(hamiltonians.heisenberg(h, 1.0, 0.0, None), h)


EXACT_STATE_CASES = ("tfim1d", "heis1d")  # spaces small enough to sum over exactly


def case_overrides(case, n_iter=None):
    """The case's Hydra overrides, with its step count replaced by `n_iter` when given."""
    return [o for o in CASES[case] if not (n_iter and o.startswith("n_iter="))] + ([f"n_iter={n_iter}"] if n_iter else [])


def common(case):
    """COMMON with the case's preconditioner group and final rounds."""
    replace = {"preconditioner=sr": f"preconditioner={PRECONDITIONER.get(case, 'sr')}",
               "final_rounds=8": f"final_rounds={FINAL_ROUNDS.get(case, 8)}"}
    return [replace.get(o, o) for o in COMMON]


def case_n_iter(case, n_iter=None):
    return n_iter or int(next(o for o in CASES[case] if o.startswith("n_iter=")).split("=")[1])


def composed_experiment(overrides):
    """vmc-runner's Experiment for Hydra `overrides` of its config, built as `python -m runner`
    builds it (touches no device)."""
    sys.path.insert(0, str(REPO))
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from runner.config.build import build

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides))
    return build(OmegaConf.to_container(cfg, resolve=True))


@functools.cache
def experiment(case):
    """vmc-runner's experiment for a case (Hilbert space, Hamiltonian, model), as the runs build it."""
    import jax

    jax.config.update("jax_enable_x64", True)
    return composed_experiment([*CASES[case], *common(case)])


def seconds(fn, *args, repeat=3):
    """fn(*args) run once (to compile), then the mean wall time of `repeat` calls in seconds, and
    the last output: the in-process timing of bench/cnn_conv.py and bench/step_parts.py."""
    import jax

    jax.block_until_ready(fn(*args))
    start = time.perf_counter()
    for _ in range(repeat):
        out = jax.block_until_ready(fn(*args))
    return (time.perf_counter() - start) / repeat, out


def our_final_params(case, run_dir):
    """The model parameters of a run's final checkpoint, read by the runner's own loader into
    the structure of the case's initial state."""
    import jax
    import jax.numpy as jnp

    from runner.core import vmc
    from runner.lifecycle import checkpoint

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

    from runner.physics import exact, hilbert

    ex = experiment(case)
    states = hilbert.all_states(ex.hilbert)
    logpsi = jax.jit(ex.problem.logpsi)
    params = jax.tree_util.tree_map(jnp.asarray, params)
    log_D = np.concatenate([np.asarray(logpsi(params, jnp.asarray(states[i:i + chunk])))
                            for i in range(0, len(states), chunk)])
    return exact.energy_of(ex.hamiltonian, ex.hilbert, np.exp(log_D - log_D.real.max()))


def run_vmc_runner(case, n_sites, extra=(), seed=0, n_iter=None, env=None, exact_state=True):
    env = process_env() if env is None else env
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "runner", *case_overrides(case, n_iter), *common(case), f"seed={seed}", *extra,
               f"hydra.run.dir={tmp}"]
        _, _, peak = measured(cmd, REPO, env)
        summary = json.loads((Path(tmp) / "summary.json").read_text())
        records = [json.loads(line) for line in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
        state_energy = (exact_state_energy(case, our_final_params(case, tmp))
                        if exact_state and case in EXACT_STATE_CASES else None)
    assert [r["step"] for r in records] == list(range(len(records))), "metrics.jsonl is not one record per step"
    return {"s_per_iter": mean_step_seconds([r["wall_time"] for r in records]),
            "compile_first": summary["compile_seconds"] + summary["first_step_seconds"],
            "energy": summary["energy"], "energy_error": summary["energy_error"], "peak_rss_mb": peak, "seed": seed,
            "n_params": summary["n_params"], "e_per_site": summary["energy"] / n_sites, "state_energy": state_energy}


def run_netket(case, python, n_sites, seed=0, driver="vmc", n_iter=None, env=None):
    env = process_env() if env is None else env
    with tempfile.TemporaryDirectory() as tmp:
        params_file = Path(tmp) / "params.npz"
        cmd = [python, str(REPO / "bench" / "netket_cases.py"), case, f"--driver={driver}", f"--seed={seed}",
               f"--n-iter={case_n_iter(case, n_iter)}", f"--warmup={WARMUP}", f"--final-rounds={FINAL_ROUNDS.get(case, 8)}",
               f"--save-params={params_file}"]
        out, _, peak = measured(cmd, REPO, env)
        result = json.loads(out.strip().splitlines()[-1])
        if process_settings(result["env"]) != process_settings(env):
            raise RuntimeError(f"NetKet ran with {process_settings(result['env'])}, not {process_settings(env)}")
        if case in EXACT_STATE_CASES:
            import numpy as np

            with np.load(params_file) as data:
                state_energy = exact_state_energy(case, {k: data[k] for k in data.files})
        else:
            state_energy = None
    return {"s_per_iter": result["s_per_iter"], "compile_first": result["compile_plus_first_iter_s"],
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


def run_order(rep):
    """Sides in the order of repetition `rep`: forwards for even, backwards for odd (A B C C B A)."""
    order = list(SIDES)
    return order if rep % 2 == 0 else order[::-1]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1],
                        help="one interleaved vmc-runner / NetKet VMC+SR / NetKet VMC_SR triple per seed "
                             "(the final run: 0 1 2 3 4)")
    parser.add_argument("--cases", nargs="+", default=list(RBM_CASES), choices=list(CASES))
    parser.add_argument("--netket-python", default=sys.executable,
                        help="an interpreter with netket 3.23.0 (e.g. /work/nkvenv/bin/python)")
    parser.add_argument("--n-iter", type=int, default=None,
                        help=f"override every case's step count (> {WARMUP}), for a quick check of the pipeline; "
                             "the final run leaves it unset (300/300/150)")
    parser.add_argument("--write", default=None,
                        help="markdown file (docs/benchmarks.md for the final run) whose side-by-side section is "
                             "replaced by this run's; the rest of the file is kept")
    parser.add_argument("--layouts", action="store_true",
                        help="instead: parallel=single against parallel=sharded parallel.cpu_devices=2")
    args = parser.parse_args(argv)
    if args.n_iter is not None and args.n_iter <= WARMUP:
        parser.error(f"--n-iter must exceed the {WARMUP} warm-up steps")
    if args.layouts:
        return compare_layouts(args)
    netket = has_netket(args.netket_python)
    if not netket:
        print(f"NetKet is not importable by {args.netket_python}: install the bench extra "
              "(pip install -e '.[bench]') or pass --netket-python; measuring vmc-runner alone", file=sys.stderr)
    env = process_env()
    rows = []
    for case in args.cases:
        exact_energy = reference_energy(case)
        runs = {side: [] for side in SIDES}
        for rep, seed in enumerate(args.seeds):
            for side in run_order(rep):
                if side == "vmc":
                    runs[side].append(run_vmc_runner(case, SIZES[case], seed=seed, n_iter=args.n_iter, env=env))
                elif netket:
                    runs[side].append(run_netket(case, args.netket_python, SIZES[case], seed=seed,
                                                 driver=NETKET_DRIVERS[side], n_iter=args.n_iter, env=env))
                else:
                    continue
                print(f"{case} seed {seed} {SIDES[side]} {runs[side][-1]['s_per_iter'] * 1e3:.1f} ms/iter",
                      file=sys.stderr)
        rows.append(summarise(case, runs, exact_energy, SIZES[case]))
    table = render(rows, netket, args, env)
    print(table)
    if args.write:
        path = Path(args.write)
        path.write_text(replace_section(path.read_text() if path.exists() else "", table))


def write_section(path, section, start, end):
    """Writes `section` between the markers `start` and `end` of the markdown file `path` (see `replace_marked`)."""
    path = Path(path)
    path.write_text(replace_marked(path.read_text() if path.exists() else "", section, start, end))


def replace_marked(text, section, start, end):
    """`text` with the part between the markers `start` and `end` replaced by `section`, or appended when absent."""
    block = f"{start}\n{section.strip()}\n{end}"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        return head + block + rest.split(end, 1)[1]
    return text.rstrip("\n") + "\n\n" + block + "\n"


def replace_section(text, section):
    """`text` with its generated side-by-side section replaced by `section` (wrapped in markers).

    The section is found by its markers; a file without them (the first generated version) has
    it from the top down to its first `## ` heading. Everything else is kept.
    """
    if SECTION_START in text and SECTION_END in text:
        return replace_marked(text, section, SECTION_START, SECTION_END)
    block = f"{SECTION_START}\n{section.rstrip()}\n{SECTION_END}\n"
    lines = text.splitlines(keepends=True)
    first_heading = next((i for i, line in enumerate(lines) if line.startswith("## ")), len(lines))
    rest = "".join(lines[first_heading:])
    return block + ("\n" + rest if rest else "")


def compare_layouts(args):
    """One device against two virtual CPU devices, interleaved; same seed, same numbers."""
    layouts = {"single": ["parallel=single"], "sharded x2": ["parallel=sharded", "parallel.cpu_devices=2"]}
    lines = ["| case | single s/iter | sharded (2 CPU devices) s/iter | ratio | same final energy |", "|---|---|---|---|---|"]
    env = process_env()
    for case in args.cases:
        runs = {name: [] for name in layouts}
        for rep, seed in enumerate(args.seeds):
            for name in (list(layouts) if rep % 2 == 0 else list(layouts)[::-1]):
                runs[name].append(run_vmc_runner(case, SIZES[case], layouts[name], seed=seed, n_iter=args.n_iter,
                                                 env=env, exact_state=False))
                print(f"{case} rep {rep} {name} {runs[name][-1]['s_per_iter'] * 1e3:.1f} ms/iter", file=sys.stderr)
        one, two = (statistics.median(r["s_per_iter"] for r in runs[n]) for n in layouts)
        same = all(a["energy"] == b["energy"] or abs(a["energy"] - b["energy"]) < 1e-10 * abs(a["energy"])
                   for a, b in zip(runs["single"], runs["sharded x2"]))
        lines.append(f"| {case} | {one:.4f} | {two:.4f} | {two / one:.2f} | {same} |")
    print("\n".join(lines))


def summarise(case, runs, exact_energy, n_sites):
    """Per side: medians over seeds of time, compile time and RSS, accuracy, per-run values;
    NetKet's best driver (the lower median s/iter) and our ratio to it; per-seed differences."""
    def med(side_runs, key):
        return statistics.median(r[key] for r in side_runs) if side_runs else None

    def accuracy(side_runs):
        """Mean over seeds of the relative error (or of E/N), and the mean error bar on it."""
        if not side_runs:
            return None, None
        scale = abs(exact_energy) if exact_energy else n_sites
        value = statistics.mean(abs(r["energy"] - exact_energy) / scale if exact_energy else r["energy"] / scale
                                for r in side_runs)
        return value, statistics.mean(r["energy_error"] / scale for r in side_runs)

    row = {"case": case, "exact": exact_energy, "paired": {}, "paired_state": {}}
    for side, side_runs in runs.items():
        row[side] = {k: med(side_runs, k) for k in ("s_per_iter", "compile_first", "peak_rss_mb")}
        row[side]["accuracy"], row[side]["accuracy_error"] = accuracy(side_runs)
        row[side]["all_s_per_iter"] = [r["s_per_iter"] for r in side_runs]
        row[side]["all_energies"] = [(r["seed"], r["energy"], r["energy_error"]) for r in side_runs]
        if exact_energy and side_runs and all(r.get("state_energy") is not None for r in side_runs):
            row[side]["state_accuracy"] = statistics.mean(abs(r["state_energy"] - exact_energy) / abs(exact_energy)
                                                          for r in side_runs)
            row[side]["all_state_energies"] = [(r["seed"], r["state_energy"]) for r in side_runs]
        if side != "vmc":
            row["paired"][side] = paired_difference(runs["vmc"], side_runs)
            row["paired_state"][side] = paired_difference(runs["vmc"], side_runs, key="state_energy")
    timed = [side for side in NETKET_DRIVERS if runs.get(side)]
    row["best"] = min(timed, key=lambda side: row[side]["s_per_iter"]) if timed else None
    row["ratio"] = row["vmc"]["s_per_iter"] / row[row["best"]]["s_per_iter"] if row["best"] else None
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


def cpu_name():
    """The CPU's model name (/proc/cpuinfo), else what `platform` says."""
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def render(rows, netket, args, env):
    """The side-by-side section (markdown, no `## ` headings: `replace_section` relies on it)."""
    import jax

    cpu = cpu_name()
    settings = ", ".join(f"`{k}={v}`" for k, v in process_settings(env).items())
    command = "python bench/run.py --seeds " + " ".join(map(str, args.seeds)) + (
        f" --n-iter {args.n_iter}" if args.n_iter else "")
    lines = [
        "# Benchmarks: vmc-runner against NetKet, side by side",
        "",
        f"Measured {datetime.date.today()} with `{command}` on {os.cpu_count()} CPU cores "
        f"({cpu}), Python {platform.python_version()}, jax {jax.__version__}"
        + (", NetKet 3.23.0 (its own venv)" if netket else ", NetKet not installed") + ".",
        "",
        f"How it is measured, both codes alike: time per iteration = wall time of the steps after the first {WARMUP}",
        "divided by their number, one synchronisation at each end of that interval (vmc-runner: metrics.jsonl",
        f"`wall_time` of the last step minus that of step {WARMUP}, each written after the step's metrics reached the",
        "host; NetKet: `block_until_ready` on parameters, sampler state and energy after step "
        f"{WARMUP} and after the last).",
        f"Every process runs with the same process settings ({settings}). The same physics, samples,",
        "learning rate (SGD 0.01) and SR diag_shift (0.01) everywhere. NetKet runs with two drivers: `VMC` + `SR`",
        "(default CG solver; heis1d declared holomorphic) and `VMC_SR` (dense QGT, Cholesky; no holomorphic mode in",
        "3.23, so heis1d solves the real 2N x 2N system); \"NetKet at its best\" is the faster of the two (median",
        "over seeds), and the ratio is ours to it. Times, compile time and RSS are medians over the runs (one per",
        "seed per code; runs alternate A B C C B A). Accuracy is the mean over seeds of the relative error of the",
        "final energy (8 x n_samples fresh samples, every code) against exact diagonalisation, or of E/N for tfim2d",
        "(lower is better), with the mean statistical error bar of one estimate after the ±; the accuracy, compile",
        "and RSS columns show NetKet's best driver.",
        "",
        "| case | vmc-runner s/iter | NetKet at its best s/iter | ratio | NetKet VMC + SR (CG) s/iter | "
        "NetKet VMC_SR (dense) s/iter | compile + 1st iter (ours / NetKet) | accuracy (ours / NetKet) | "
        "peak RSS MB (ours / NetKet) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        v = r["vmc"]
        n = r[r["best"]] if r["best"] else {}
        best = f"{fmt(n.get('s_per_iter'), '.4f')} ({'CG' if r['best'] == 'nk_cg' else 'dense'})" if r["best"] else "—"
        acc_fmt = ".2e" if r["exact"] else ".5f"
        lines.append(
            f"| {r['case']} | {fmt(v['s_per_iter'], '.4f')} | {best} | {fmt(r['ratio'], '.2f')} | "
            f"{fmt(r['nk_cg']['s_per_iter'], '.4f')} | {fmt(r['nk_dense']['s_per_iter'], '.4f')} | "
            f"{fmt(v['compile_first'], '.1f')} s / {fmt(n.get('compile_first'), '.1f')} s | "
            f"{fmt(v['accuracy'], acc_fmt)} ± {fmt(v['accuracy_error'], '.1e')} / "
            f"{fmt(n.get('accuracy'), acc_fmt)} ± {fmt(n.get('accuracy_error'), '.1e')} | "
            f"{fmt(v['peak_rss_mb'], '.0f')} / {fmt(n.get('peak_rss_mb'), '.0f')} |"
        )
    nk_sides = list(NETKET_DRIVERS)
    lines += ["", "NetKet's two drivers (medians over seeds; accuracy as above):", "",
              "| case | driver | s/iter | compile + 1st iter s | accuracy | peak RSS MB |", "|---|---|---|---|---|---|"]
    for r in rows:
        for side in nk_sides:
            n, acc_fmt = r[side], (".2e" if r["exact"] else ".5f")
            lines.append(f"| {r['case']} | {SIDES[side]} | {fmt(n['s_per_iter'], '.4f')} | {fmt(n['compile_first'], '.1f')} | "
                         f"{fmt(n['accuracy'], acc_fmt)} ± {fmt(n['accuracy_error'], '.1e')} | {fmt(n['peak_rss_mb'], '.0f')} |")
    lines += ["", "Per-run s/iter: " + "; ".join(
        f"{r['case']}: " + ", ".join(f"{SIDES[s]} {[round(x, 4) for x in r[s]['all_s_per_iter']]}" for s in SIDES)
        for r in rows), "", "Per-run final energies (seed, E, error bar): " + "; ".join(
        f"{r['case']}: " + ", ".join(f"{SIDES[s]} {[(sd, round(e, 6), round(d, 6)) for sd, e, d in r[s]['all_energies']]}"
                                     for s in SIDES)
        for r in rows), ""]
    paired = [f"{r['case']} − {SIDES[s]} {p[0]:+.4f} ± {p[1]:.4f} ({p[2]} seeds)"
              for r in rows for s in nk_sides if (p := r["paired"].get(s))]
    if paired:
        lines += ["Final energy, ours − NetKet at the same seed (mean ± standard error over seeds; negative: "
                  "ours lower): " + "; ".join(paired), ""]
    exact_rows = [r for r in rows if r["vmc"].get("state_accuracy") is not None]
    if exact_rows:
        lines += ["Exact energy of the final wavefunction, <psi|H|psi>/<psi|psi> summed over the whole basis "
                  "(no sampling noise; NetKet's final parameters evaluated by the same code):", "",
                  "| case | relative error, ours | relative error, NetKet VMC + SR | relative error, NetKet VMC_SR | "
                  "ours − NetKet VMC + SR at the same seed | ours − NetKet VMC_SR at the same seed |",
                  "|---|---|---|---|---|---|"]
        for r in exact_rows:
            diffs = [(f"{p[0]:+.5f} ± {p[1]:.5f} ({p[2]} seeds)" if (p := r["paired_state"].get(s)) else "—")
                     for s in nk_sides]
            lines.append(f"| {r['case']} | {r['vmc']['state_accuracy']:.2e} | "
                         + " | ".join(fmt(r[s].get("state_accuracy"), ".2e") for s in nk_sides) + " | "
                         + " | ".join(diffs) + " |")
        lines += ["", "Per-run exact final-state energies (seed, E): " + "; ".join(
            f"{r['case']}: " + ", ".join(f"{SIDES[s]} {[(sd, round(e, 6)) for sd, e in r[s].get('all_state_energies', [])]}"
                                         for s in SIDES) for r in exact_rows), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
