#!/usr/bin/env python
"""Deep models side by side: the same Flax CNN and ViT in vmc-runner and NetKet on the 6 x 6 J1-J2 lattice.

Final run (writes the "Deep models" section of docs/benchmarks.md; 2 models x 6 variants x 3 seeds, one
fresh process each, interleaved; the variants are each code on one and on two CPU devices and NetKet
also under XLA's own small-loop threshold, `VARIANTS`; each code is compared at its fastest):

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
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from run import cpu_name, write_section  # noqa: E402  (bench/run.py)

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
          "hamiltonian.J2=0.5", "hamiltonian.phase_prior=marshall", "sampler=metropolis_exchange", "dtype=float64",
          f"sampler.n_samples={N_SAMPLES}",
          f"sampler.n_chains={N_CHAINS}", f"sampler.n_discard_per_chain={N_DISCARD}", f"sampler.sweep_size={SWEEP}",
          "optimizer=sgd", "preconditioner=minsr",
          f"preconditioner.diag_shift={DIAG_SHIFT}", "exact=false", "final_rounds=8", "checkpoint_every=100000"]
SIDES = {"vmc": "vmc-runner", "nk": "NetKet VMC_SR (NTK)"}
# Each code on one CPU device and on two (ours: `parallel=sharded parallel.cpu_devices=2`; NetKet:
# NETKET_EXPERIMENTAL_SHARDING_CPU=2, its chains sharded over both), and NetKet also without the
# runner's raised small-loop threshold (XLA's own 1 kB: XLA:CPU then compiles no Metropolis loop
# into one kernel, which slows a convolution there; runner.core.kernels.outside_loop_kernels keeps our
# CNN's loops out of them). "At its best" is each code's fastest variant (median s/iter).
VARIANTS = {
    "vmc 1": ("vmc", 1, False), "vmc 2": ("vmc", 2, False),
    "nk 1": ("nk", 1, False), "nk 2": ("nk", 2, False),
    "nk 1 xla": ("nk", 1, True), "nk 2 xla": ("nk", 2, True),
}
XLA_SMALL_LOOP_DEFAULT = "--xla_backend_extra_options=xla_cpu_small_while_loop_byte_threshold=1024"
SECTION_START = "<!-- bench/deep.py: start (generated; rerun to replace) -->"
SECTION_END = "<!-- bench/deep.py: end -->"


def overrides(case, n_iter=N_ITER, seed=0):
    """vmc-runner's Hydra overrides for a case."""
    name, kwargs = MODELS[case]
    return [*COMMON, f"model={case}", *(f"model.{k}={v}" for k, v in kwargs.items()),
            f"optimizer.learning_rate={LEARNING_RATE[case]}", f"n_iter={n_iter}", f"seed={seed}"]


def lattice():
    from runner.physics import hilbert

    return hilbert.square(L, total_sz=0)


def our_model(case):
    """Our Flax module of the case, built on our lattice, float64 parameters (as the runner builds it)."""
    import jax.numpy as jnp

    import models

    name, kwargs = MODELS[case]
    return getattr(models, name)(**kwargs, hilbert=lattice(), param_dtype=jnp.float64)


def init_key(seed):
    """The key our runner initialises parameters with (`runner.core.vmc.init_state`)."""
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

    from runner.core import local_energy, sampler
    from runner.physics import hamiltonians

    h = lattice()
    ours_H = hamiltonians.heisenberg(h, 1.0, 0.5, "marshall")
    keys = jax.random.split(jax.random.PRNGKey(seed), n_states)
    sigma_SxN = np.asarray(jax.vmap(lambda k: sampler.random_state(h, k))(keys))
    logpsi = lambda p, s: model.apply({"params": p}, s)  # noqa: E731
    ours = np.asarray([local_energy.local_energy(ours_H, logpsi, params, jnp.asarray(s)) for s in sigma_SxN])
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
        "versions": {"netket": nk.__version__, "jax": jax.__version__}, "devices": jax.device_count(),
    }), flush=True)


# --- the driver (runs under vmc-runner's interpreter) -----------------------------------------


def variant_label(name):
    """How a variant reads in the table."""
    code, devices, xla_default = VARIANTS[name]
    return (f"{SIDES[code]}, {devices} device{'s' if devices > 1 else ''}"
            + (", XLA's small-loop threshold" if xla_default else ""))


def variant_env(name, env):
    """The process environment of a variant: the common settings, NetKet's device count, and for
    the `xla` variants XLA's own small-loop threshold in place of the runner's."""
    code, devices, xla_default = VARIANTS[name]
    env = dict(env)
    if code == "nk" and devices > 1:
        env["NETKET_EXPERIMENTAL_SHARDING_CPU"] = str(devices)
    if xla_default:
        env["XLA_FLAGS"] = " ".join([f for f in env.get("XLA_FLAGS", "").split()
                                     if "xla_backend_extra_options" not in f] + [XLA_SMALL_LOOP_DEFAULT])
    return env


def run_variant(name, case, seed, n_iter, env, python, on_the_fly="auto"):
    code, devices, _ = VARIANTS[name]
    env = variant_env(name, env)
    if code == "vmc":
        layout = ["parallel=sharded", f"parallel.cpu_devices={devices}"] if devices > 1 else ["parallel=single"]
        return run_ours(case, seed, n_iter, env, layout)
    result = run_theirs(case, seed, n_iter, env, python, on_the_fly)
    if result["devices"] != devices:
        raise RuntimeError(f"NetKet ran on {result['devices']} devices, not {devices}")
    return result


def run_ours(case, seed, n_iter, env, layout=()):
    from run import mean_step_seconds, measured

    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "runner", *overrides(case, n_iter, seed), *layout, f"hydra.run.dir={tmp}"]
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
            "solver": result["solver"], "hamiltonian_check": result["hamiltonian_check"],
            "devices": result["devices"]}


def run_order(rep, variants=tuple(VARIANTS)):
    """Layout by layout, ours before NetKet's; the whole order reversed for odd repetitions."""
    order = sorted(variants, key=lambda v: (VARIANTS[v][1], VARIANTS[v][0] != "vmc", VARIANTS[v][2]))
    return order if rep % 2 == 0 else order[::-1]


def summarise(case, runs):
    """Medians over seeds per variant; each code's best variant and our best over NetKet's."""
    row = {"case": case, "variants": {}}
    for name, variant_runs in runs.items():
        row["variants"][name] = {k: statistics.median(r[k] for r in variant_runs)
                                 for k in ("s_per_iter", "compile_first", "peak_rss_mb")}
        row["variants"][name]["n_params"] = variant_runs[0]["n_params"]
        row["variants"][name]["runs"] = variant_runs
    for code in SIDES:
        mine = [v for v in row["variants"] if VARIANTS[v][0] == code]
        row[code] = min(mine, key=lambda v: row["variants"][v]["s_per_iter"])
    row["ratio"] = row["variants"][row["vmc"]]["s_per_iter"] / row["variants"][row["nk"]]["s_per_iter"]
    return row


def describe(case):
    """The case's model size as `key value, ...`."""
    return ", ".join(f"{k} {v}" for k, v in MODELS[case][1].items())


def render(rows, args, env):
    """The "Deep models" section (markdown)."""
    import jax
    from run import process_settings

    cpu = cpu_name()
    settings = ", ".join(f"`{k}={v}`" for k, v in process_settings(env).items())
    solver = next(x["solver"] for v, data in rows[0]["variants"].items() if VARIANTS[v][0] == "nk"
                  for x in data["runs"])
    command = (f"python bench/deep.py --seeds {' '.join(map(str, args.seeds))} --n-iter {args.n_iter} "
               f"--variants {' '.join(repr(v) if ' ' in v else v for v in args.variants)}")
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
        "through its generic path (no fast path exists for these models). Process settings of every run: " + settings +
        "; the variants marked \"XLA's small-loop threshold\" replace the runner's raised threshold in `XLA_FLAGS` "
        f"by `{XLA_SMALL_LOOP_DEFAULT.split('=', 1)[1]}`. Each code runs on one CPU device and on two (ours: "
        "`parallel=sharded parallel.cpu_devices=2`; NetKet: `NETKET_EXPERIMENTAL_SHARDING_CPU=2`, its process "
        "checked to see 2 devices). One fresh process per run, variants interleaved (the order reversed every "
        "other seed), all under the same `nice`. Each code at its best is its variant with the lowest median "
        "time per iteration; the ratio is ours at its best over NetKet's at its best. Final energies from "
        f"{8 * N_SAMPLES} fresh samples at the final parameters.",
        "",
        "| model | parameters P | vmc-runner at its best s/iter | NetKet at its best s/iter | ratio |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        best = {code: r["variants"][r[code]] for code in SIDES}
        lines.append(f"| {r['case']} | {best['vmc']['n_params']:,} | {best['vmc']['s_per_iter']:.3f} "
                     f"({variant_label(r['vmc'])}) | {best['nk']['s_per_iter']:.3f} ({variant_label(r['nk'])}) | "
                     f"{r['ratio']:.2f} |")
    lines += ["", "| model | variant | s/iter (median) | per run | compile + 1st iter s | peak RSS MB | final energies |",
              "|---|---|---|---|---|---|---|"]
    for r in rows:
        for name, v in r["variants"].items():
            energies = ", ".join(f"{x['energy']:.3f} ± {x['energy_error']:.3f}" for x in v["runs"])
            per_run = ", ".join(f"{x['s_per_iter']:.3f}" for x in v["runs"])
            lines.append(f"| {r['case']} | {variant_label(name)} | {v['s_per_iter']:.3f} | {per_run} | "
                         f"{v['compile_first']:.1f} | {v['peak_rss_mb']:.0f} | {energies} |")
    lines += ["", "Energy of the first step (same initial parameters, different samples): " + "; ".join(
        f"{r['case']}: " + ", ".join(f"{variant_label(v)} {[round(x['first_energy'], 3) for x in d['runs']]}"
                                     for v, d in r["variants"].items())
        for r in rows), ""]
    return "\n".join(lines)


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
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS),
                        help="code, CPU devices and (xla) XLA's small-loop threshold of each variant run")
    parser.add_argument("--note", default="", help="a sentence for the docs (e.g. that the machine was shared)")
    parser.add_argument("--write", default=None, help="markdown file whose Deep models section is replaced")
    args = parser.parse_args(argv)
    if args.n_iter <= WARMUP:
        parser.error(f"--n-iter must exceed the {WARMUP} warm-up steps")
    if not {VARIANTS[v][0] for v in args.variants} >= set(SIDES):
        parser.error("--variants needs at least one of each code's")
    from run import process_env

    env = process_env()
    rows = []
    for case in args.cases:
        runs = {name: [] for name in run_order(0, args.variants)}
        for rep, seed in enumerate(args.seeds):
            for name in run_order(rep, args.variants):
                result = run_variant(name, case, seed, args.n_iter, env, args.netket_python, args.on_the_fly)
                runs[name].append(result)
                print(f"{case} seed {seed} {variant_label(name)} {result['s_per_iter'] * 1e3:.1f} ms/iter, "
                      f"compile+1st {result['compile_first']:.1f} s, {result['peak_rss_mb']:.0f} MB, "
                      f"E {result['energy']:.4f} ± {result['energy_error']:.4f}", file=sys.stderr, flush=True)
        rows.append(summarise(case, runs))
    section = render(rows, args, env)
    print(section)
    if args.write:
        write_section(args.write, section, SECTION_START, SECTION_END)


if __name__ == "__main__":
    main()
