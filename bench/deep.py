#!/usr/bin/env python
"""Deep models side by side: the same Flax CNN and ViT in vmc-runner and NetKet on the 6 x 6 J1-J2 lattice.

Final run (writes the "Deep models" section of docs/benchmarks.md; 2 models x 2 codes x 3 seeds, one
fresh process each, interleaved ours / NetKet / NetKet / ours / ...):

    nice -n 5 python bench/deep.py --seeds 0 1 2 --netket-python /work/nkvenv/bin/python --write docs/benchmarks.md

Quick check of the pipeline (prints, writes nothing):

    python bench/deep.py --seeds 0 --n-iter 15 --netket-python /work/nkvenv/bin/python

The NetKet side is this file too (`python bench/deep.py netket CASE ...` under NetKet's interpreter):
it builds our own `models.CNN` / `models.ViT` on our lattice and hands them to `nk.vqs.MCState`, so
both codes optimise the same function of the same parameters. What is the same on both sides: the
6 x 6 periodic square lattice, H = sum_<ij> s_i.s_j + 0.5 sum_<<ij>> s_i.s_j (Pauli matrices) with the
Marshall sign on the nearest-neighbour bonds (NetKet: `Heisenberg(J=[1, 0.5], sign_rule=[True, False])`
on its own `nk.graph.Square(6, max_neighbor_order=2)`; before timing, the NetKet process checks that
its local energies equal ours on random configurations), the Sz = 0 sector, Metropolis exchange on
nearest-neighbour bonds with 16 chains, 256 samples, 5 discarded sweeps of 36 proposals per chain,
float64 parameters, minSR (ours: `preconditioner=minsr`; NetKet: `VMC_SR(use_ntk=True)`) with
diag_shift 0.01, SGD (0.01 for the CNN, 0.002 for the ViT), the seed's initial parameters (both call
`model.init` with the same key),
the process settings (bench/run.py `process_env`), and the timing (bench/run.py: wall time of the
steps after the first 10 over their number, one synchronisation at each end). The proposal rules
differ in detail: ours draws among the bonds whose spins differ (with the Hastings correction),
NetKet's among all bonds (a swap of equal spins is a rejected no-op); each evaluates the model once
per proposal and chain, so the cost per step is the same.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

WARMUP = 10
L = 6
N_SAMPLES, N_CHAINS, N_DISCARD, SWEEP = 256, 16, 5, 36
DIAG_SHIFT = 0.01
# The model of each case: our config overrides and the same module's constructor arguments.
MODELS = {
    "cnn": ("CNN", {"channels": 8, "kernel_size": 3, "depth": 2}),
    "vit": ("ViT", {"patch_size": 2, "d_model": 16, "n_heads": 2, "n_layers": 2}),
}
# SGD learning rate per case, the same in both codes (the ViT with real parameters diverged at 0.01 with its earlier unit-gain initialisation).
LEARNING_RATE = {"cnn": 0.01, "vit": 0.002}
N_ITER = 20
# The physics of experiment=j1j2_square (which also sets the RBM's alpha, so it is spelled out here).
COMMON = ["hilbert=square", f"hilbert.L={L}", "hilbert.total_sz=0", "hamiltonian=heisenberg", "hamiltonian.J=1.0",
          "hamiltonian.J2=0.5", "hamiltonian.sign_rule=true", "sampler=metropolis_exchange", "dtype=float64",
          f"sampler.n_samples={N_SAMPLES}",
          f"sampler.n_chains={N_CHAINS}", f"sampler.n_discard_per_chain={N_DISCARD}", f"sampler.sweep_size={SWEEP}",
          "optimizer=sgd", "preconditioner=minsr",
          f"preconditioner.diag_shift={DIAG_SHIFT}", "exact=false", "final_rounds=8", "checkpoint_every=100000"]
SIDES = {"vmc": "vmc-runner", "nk": "NetKet VMC_SR (NTK)"}
SECTION_START = "<!-- bench/deep.py: start (generated; rerun to replace) -->"
SECTION_END = "<!-- bench/deep.py: end -->"


def overrides(case, n_iter=N_ITER, seed=0):
    """vmc-runner's Hydra overrides for a case."""
    name, kwargs = MODELS[case]
    return [*COMMON, f"model={case}", *(f"model.{k}={v}" for k, v in kwargs.items()),
            f"optimizer.learning_rate={LEARNING_RATE[case]}", f"n_iter={n_iter}", f"seed={seed}"]


def lattice():
    from runner import hilbert

    return hilbert.square(L, total_sz=0)


def our_model(case):
    """Our Flax module of the case, built on our lattice, float64 parameters (as the runner builds it)."""
    import jax.numpy as jnp

    import models

    name, kwargs = MODELS[case]
    return getattr(models, name)(**kwargs, hilbert=lattice(), param_dtype=jnp.float64)


def init_key(seed):
    """The key our runner initialises parameters with (`runner.vmc.init_state`)."""
    import jax

    return jax.random.fold_in(jax.random.PRNGKey(seed), 2**31 - 1)


# --- the NetKet side (runs under NetKet's interpreter) ----------------------------------------


def netket_problem():
    """NetKet's Hilbert space, Hamiltonian and exchange clusters, from NetKet's own lattice."""
    import netket as nk

    g = nk.graph.Square(L, pbc=True, max_neighbor_order=2)
    hi = nk.hilbert.Spin(s=0.5, N=g.n_nodes, total_sz=0)
    H = nk.operator.Heisenberg(hi, g, J=[1.0, 0.5], sign_rule=[True, False])
    nn_edges = [tuple(e) for e in g.edges(filter_color=0)]
    return hi, H, nn_edges


def check_hamiltonians(H, model, params, n_states=16, seed=123):
    """Max |E_loc(NetKet) - E_loc(ours)| over random Sz = 0 states, same model and parameters; raises
    if they differ (a different site order, sign rule or coupling would show here)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from runner import operators, sampler

    h = lattice()
    ours_H = operators.heisenberg(h, 1.0, 0.5, True)
    keys = jax.random.split(jax.random.PRNGKey(seed), n_states)
    sigma_SxN = np.asarray(jax.vmap(lambda k: sampler.random_state(h, k))(keys))
    logpsi = lambda p, s: model.apply({"params": p}, s)  # noqa: E731
    ours = np.asarray([operators.local_energy(ours_H, logpsi, params, jnp.asarray(s)) for s in sigma_SxN])
    conn, mels = H.get_conn_padded(sigma_SxN.astype(np.float64))
    log_conn = np.asarray(logpsi(params, jnp.asarray(conn)))
    log_s = np.asarray(logpsi(params, jnp.asarray(sigma_SxN)))
    theirs = np.sum(mels * np.exp(log_conn - log_s[:, None]), axis=-1)
    err = float(np.max(np.abs(ours - theirs)))
    if not err <= 1e-9 * max(1.0, float(np.max(np.abs(ours)))):
        raise SystemExit(f"the Hamiltonians differ: max |E_loc difference| = {err:g}")
    return err


def netket_main(argv):
    """Runs one case with NetKet's VMC_SR (NTK) on our module; prints one JSON line."""
    parser = argparse.ArgumentParser()
    parser.add_argument("case", choices=list(MODELS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-iter", type=int, default=N_ITER)
    parser.add_argument("--warmup", type=int, default=WARMUP)
    parser.add_argument("--on-the-fly", choices=["auto", "true", "false"], default="auto",
                        help="VMC_SR's on_the_fly (auto: NetKet's default, True with the NTK)")
    args = parser.parse_args(argv)
    import jax

    jax.config.update("jax_enable_x64", True)
    import netket as nk
    import numpy as np

    from netket_cases import _Timer, synchronize
    from run import REPORTED_ENV

    hi, H, nn_edges = netket_problem()
    model = our_model(args.case)
    t_setup = time.perf_counter()
    sampler = nk.sampler.MetropolisExchange(hi, clusters=nn_edges, n_chains=N_CHAINS, sweep_size=SWEEP)
    vs = nk.vqs.MCState(sampler, model, n_samples=N_SAMPLES, n_discard_per_chain=N_DISCARD,
                        seed=args.seed, sampler_seed=args.seed + 1)
    # Our runner's initial parameters for this seed (runner.app: model.init with its key on all-up spins).
    import jax.numpy as jnp

    vs.parameters = model.init(init_key(args.seed), jnp.ones((L * L,), jnp.int8))["params"]
    hamiltonian_error = check_hamiltonians(H, model, vs.parameters)
    on_the_fly = {"auto": None, "true": True, "false": False}[args.on_the_fly]
    import contextlib

    with contextlib.redirect_stdout(sys.stderr):
        driver = nk.driver.VMC_SR(H, nk.optimizer.Sgd(LEARNING_RATE[args.case]), diag_shift=DIAG_SHIFT,
                                  variational_state=vs, use_ntk=True, on_the_fly=on_the_fly)
    setup_s = time.perf_counter() - t_setup
    timer = _Timer(args.warmup)
    driver.run(args.n_iter, out=None, show_progress=False, callback=timer)
    synchronize(driver)
    t_end = time.perf_counter()
    import resource

    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    energies = [float(np.real(s.mean)) for s in timer.stats]
    vs.n_samples = 8 * N_SAMPLES
    vs.reset()
    final = vs.expect(H)
    print(json.dumps({
        "case": args.case, "seed": args.seed, "n_iter": args.n_iter, "n_params": int(vs.n_parameters),
        "s_per_iter": (t_end - timer.marks["timed_start"]) / (args.n_iter - args.warmup),
        "compile_plus_first_iter_s": timer.marks["first_step_s"], "setup_s": setup_s,
        "final_energy": float(np.real(final.mean)), "final_energy_error": float(np.real(final.error_of_mean)),
        "energies": energies, "peak_rss_mb": peak_rss, "hamiltonian_check": hamiltonian_error,
        "solver": f"VMC_SR(use_ntk=True, on_the_fly={driver.on_the_fly}, mode={driver.mode})",
        "env": {k: os.environ.get(k) for k in REPORTED_ENV},
        "versions": {"netket": nk.__version__, "jax": jax.__version__},
    }), flush=True)


# --- the driver (runs under vmc-runner's interpreter) -----------------------------------------


def run_ours(case, seed, n_iter, env):
    from run import mean_step_seconds, measured

    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "runner", *overrides(case, n_iter, seed), f"hydra.run.dir={tmp}"]
        _, _, peak = measured(cmd, REPO, env)
        summary = json.loads((Path(tmp) / "summary.json").read_text())
        records = [json.loads(line) for line in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
    return {"s_per_iter": mean_step_seconds([r["wall_time"] for r in records], WARMUP),
            "compile_first": summary["compile_seconds"] + summary["first_step_seconds"],
            "energy": summary["energy"], "energy_error": summary["energy_error"], "peak_rss_mb": peak,
            "n_params": summary["n_params"], "seed": seed, "first_energy": records[0]["energy"]}


def run_theirs(case, seed, n_iter, env, python, on_the_fly="auto"):
    from run import measured, process_settings

    cmd = [python, str(Path(__file__).resolve()), "netket", case, f"--seed={seed}", f"--n-iter={n_iter}",
           f"--warmup={WARMUP}", f"--on-the-fly={on_the_fly}"]
    out, _, peak = measured(cmd, REPO, env)
    result = json.loads(out.strip().splitlines()[-1])
    if process_settings(result["env"]) != process_settings(env):
        raise RuntimeError(f"NetKet ran with {process_settings(result['env'])}, not {process_settings(env)}")
    return {"s_per_iter": result["s_per_iter"], "compile_first": result["compile_plus_first_iter_s"],
            "energy": result["final_energy"], "energy_error": result["final_energy_error"], "peak_rss_mb": peak,
            "n_params": result["n_params"], "seed": seed, "first_energy": result["energies"][0],
            "solver": result["solver"], "hamiltonian_check": result["hamiltonian_check"]}


def run_order(rep):
    """ours, NetKet for even repetitions; NetKet, ours for odd ones."""
    return list(SIDES) if rep % 2 == 0 else list(SIDES)[::-1]


def summarise(case, runs):
    """Medians over seeds per side and our time over NetKet's."""
    row = {"case": case}
    for side, side_runs in runs.items():
        row[side] = {k: statistics.median(r[k] for r in side_runs)
                     for k in ("s_per_iter", "compile_first", "peak_rss_mb")}
        row[side]["n_params"] = side_runs[0]["n_params"]
        row[side]["runs"] = side_runs
    row["ratio"] = row["vmc"]["s_per_iter"] / row["nk"]["s_per_iter"]
    return row


def describe(case):
    """The case's model size as `key value, ...`."""
    return ", ".join(f"{k} {v}" for k, v in MODELS[case][1].items())


def render(rows, args, env):
    """The "Deep models" section (markdown)."""
    import jax

    from run import process_settings

    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor()
    settings = ", ".join(f"`{k}={v}`" for k, v in process_settings(env).items())
    solver = rows[0]["nk"]["runs"][0]["solver"]
    command = f"python bench/deep.py --seeds {' '.join(map(str, args.seeds))} --n-iter {args.n_iter}"
    lines = [
        "## Deep models: the same CNN and ViT in vmc-runner and NetKet",
        "",
        f"Measured {datetime.date.today()} with `{command}` on {os.cpu_count()} CPU cores ({cpu}), Python "
        f"{platform.python_version()}, jax {jax.__version__}, NetKet 3.23.0 (its own venv). "
        f"{args.note}".rstrip(),
        "",
        f"6 x 6 J1-J2 (J2 = 0.5, Marshall sign, Sz = 0), our `models.CNN` ({describe('cnn')}) and "
        f"`models.ViT` ({describe('vit')}), float64 parameters, given to NetKet's "
        f"`MCState` unchanged; {N_SAMPLES} samples in {N_CHAINS} chains, {N_DISCARD} discarded sweeps of {SWEEP} "
        f"exchange proposals per chain; minSR against NetKet's `{solver}`, diag_shift {DIAG_SHIFT}, "
        f"SGD with learning rate {LEARNING_RATE['cnn']} (CNN) and {LEARNING_RATE['vit']} (ViT; 0.01 diverged with its earlier initialisation); "
        f"{args.n_iter} steps, the first {WARMUP} untimed. Both codes evaluate the model "
        "through its generic path (no fast path exists for these models). Process settings: " + settings + ". "
        "One fresh process per run, runs interleaved (ours, NetKet, NetKet, ours, ...), all under the same "
        "`nice`; the ratio is ours over NetKet's median time per iteration. Final energies from "
        f"{8 * N_SAMPLES} fresh samples at the final parameters.",
        "",
        "| model | parameters P | vmc-runner s/iter | NetKet s/iter | ratio | compile + 1st iter s (ours / NetKet) "
        "| peak RSS MB (ours / NetKet) | final energy, ours | final energy, NetKet |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        v, n = r["vmc"], r["nk"]
        def energy(side):
            return ", ".join(f"{x['energy']:.3f} ± {x['energy_error']:.3f}" for x in r[side]["runs"])

        lines.append(f"| {r['case']} | {v['n_params']:,} | {v['s_per_iter']:.3f} | {n['s_per_iter']:.3f} | "
                     f"{r['ratio']:.2f} | {v['compile_first']:.1f} / {n['compile_first']:.1f} | "
                     f"{v['peak_rss_mb']:.0f} / {n['peak_rss_mb']:.0f} | {energy('vmc')} | {energy('nk')} |")
    lines += ["", "Per-run s/iter (seed order): " + "; ".join(
        f"{r['case']}: " + ", ".join(f"{SIDES[s]} {[round(x['s_per_iter'], 3) for x in r[s]['runs']]}" for s in SIDES)
        for r in rows), ""]
    lines += ["Energy of the first step (same initial parameters, different samples): " + "; ".join(
        f"{r['case']}: " + ", ".join(f"{SIDES[s]} {[round(x['first_energy'], 3) for x in r[s]['runs']]}" for s in SIDES)
        for r in rows), ""]
    return "\n".join(lines)


def replace_section(text, section):
    """`text` with the section between this script's markers replaced (appended when absent)."""
    block = f"{SECTION_START}\n{section.rstrip()}\n{SECTION_END}\n"
    if SECTION_START in text and SECTION_END in text:
        head, rest = text.split(SECTION_START, 1)
        return head + block + rest.split(SECTION_END, 1)[1]
    return text.rstrip("\n") + "\n\n" + block


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["netket"]:
        return netket_main(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--cases", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--n-iter", type=int, default=N_ITER)
    parser.add_argument("--netket-python", default="/work/nkvenv/bin/python")
    parser.add_argument("--on-the-fly", choices=["auto", "true", "false"], default="auto")
    parser.add_argument("--note", default="", help="a sentence for the docs (e.g. that the machine was shared)")
    parser.add_argument("--write", default=None, help="markdown file whose Deep models section is replaced")
    args = parser.parse_args(argv)
    if args.n_iter <= WARMUP:
        parser.error(f"--n-iter must exceed the {WARMUP} warm-up steps")
    from run import process_env

    env = process_env()
    rows = []
    for case in args.cases:
        runs = {side: [] for side in SIDES}
        for rep, seed in enumerate(args.seeds):
            for side in run_order(rep):
                result = (run_ours(case, seed, args.n_iter, env) if side == "vmc" else
                          run_theirs(case, seed, args.n_iter, env, args.netket_python, args.on_the_fly))
                runs[side].append(result)
                print(f"{case} seed {seed} {SIDES[side]} {result['s_per_iter'] * 1e3:.1f} ms/iter, "
                      f"compile+1st {result['compile_first']:.1f} s, {result['peak_rss_mb']:.0f} MB, "
                      f"E {result['energy']:.4f} ± {result['energy_error']:.4f}", file=sys.stderr, flush=True)
        rows.append(summarise(case, runs))
    section = render(rows, args, env)
    print(section)
    if args.write:
        path = Path(args.write)
        path.write_text(replace_section(path.read_text() if path.exists() else "", section))


if __name__ == "__main__":
    main()
