#!/usr/bin/env python
"""The TDVP benchmark: the 1D quench of `experiment=tfim_quench_1d` (periodic TFIM chain, complex
translation-symmetric RBM alpha 2, 4096 samples, RK4, dt 0.01, soft pseudo-inverse rcond 1e-6) in
vmc-runner and in NetKet (`bench/netket_tdvp.py`: `netket.experimental.TDVP`), and in vmc-runner's
projected tVMC (`task/integrator=ptvmc`, same model and samples, at each of `--ptvmc-dts`), started
from the uniform state |+x>, interleaved (the order rotates each repeat), each a fresh process. The
runner starts from the RBMSymm's `plus_x` (each feature attached to one site: a trajectory that
moves); NetKet's side from all-zero parameters, whose tangent holds single-site fields only (a
frozen trajectory). At a fixed step a TDVP step's work does not depend on the parameters' values,
so the tVMC times compare; the trajectories do not. A projected step's work does (its updates stop
at its tolerance), so its times are those of the moving trajectory.

Reported: seconds of wall time per unit of physical time, from the first saved time after t = 0
to t_end (compilation and the first interval left out), and their ratio (ours / NetKet's). The
runner also measures the energy on fresh samples at every saved time (NetKet reads its step's);
NetKet's side does not.

Usage: python bench/tdvp.py --netket-python /path/to/netket/venv/bin/python [--repeats 2]
                            [--L 40] [--n-samples 4096] [--t-end 0.3] [--ptvmc-dts 0.01 0.05]
"""

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from run import REPO, process_env  # bench/ is on sys.path

DT, SAVE_EVERY, RCOND, H = 0.01, 0.05, 1e-6, 1.0


def code_name(ptvmc_dt: float | None = None) -> str:
    """The name of vmc-runner's side in the results: by RK4 tVMC, or by projected tVMC at step `ptvmc_dt`."""
    return "vmc-runner" if ptvmc_dt is None else f"vmc-runner ptvmc dt={ptvmc_dt}"


def ours(args, run_dir: Path, env, ptvmc_dt: float | None = None) -> dict:
    """vmc-runner's run of the quench in `run_dir` (by RK4 tVMC, or by projected tVMC at step
    `ptvmc_dt`); its seconds per unit time from trajectory.jsonl."""
    integrator = (["task/integrator=rk4", f"task.integrator.dt={DT}"] if ptvmc_dt is None
                  else ["task/integrator=ptvmc", f"task.integrator.dt={ptvmc_dt}"])
    subprocess.run([sys.executable, "-m", "runner", "task=dynamics", f"hilbert.L={args.L}", f"hamiltonian.h={H}",
                    "model=rbm_symm", "model.alpha=2", "dtype=complex128", f"sampler.n_samples={args.n_samples}",
                    *integrator, f"task.save_every={SAVE_EVERY}",
                    f"task.equation.rcond={RCOND}",
                    f"task.t_end={args.t_end}", "exact=false", "observables=none", "logger=[jsonl]",
                    f"hydra.run.dir={run_dir}"], cwd=REPO, env=env, check=True, capture_output=True)
    records = [json.loads(line) for line in (run_dir / "trajectory.jsonl").read_text().splitlines()]
    first = next(r for r in records if r["t"] > 1e-12)
    last = records[-1]
    return {"code": code_name(ptvmc_dt), "seconds_per_unit_time": (last["wall_time"] - first["wall_time"]) / (last["t"] - first["t"]),
            "saved_times": [r["t"] for r in records], "energies": [r["energy"] for r in records]}


def netket(args, env) -> dict:
    out = subprocess.run([args.netket_python, str(REPO / "bench" / "netket_tdvp.py"), f"--L={args.L}", f"--h={H}",
                          f"--n-samples={args.n_samples}", f"--dt={DT}", f"--t-end={args.t_end}",
                          f"--save-every={SAVE_EVERY}", f"--rcond={RCOND}"],
                         env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--netket-python", required=True)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--L", type=int, default=40)
    parser.add_argument("--n-samples", type=int, default=4096)
    parser.add_argument("--t-end", type=float, default=0.3)
    parser.add_argument("--ptvmc-dts", type=float, nargs="*", default=[DT, 0.05],
                        help="projected tVMC's steps to time (none: leave it out)")
    args = parser.parse_args(argv)
    env = process_env()
    runs = {code_name(): lambda run_dir: ours(args, run_dir, env), "netket": lambda run_dir: netket(args, env)}
    for dt in args.ptvmc_dts:
        runs[code_name(dt)] = lambda run_dir, dt=dt: ours(args, run_dir, env, ptvmc_dt=dt)
    codes = list(runs)
    times = {code: [] for code in codes}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            shift = rep % len(codes)
            for i, code in enumerate(codes[shift:] + codes[:shift]):
                result = runs[code](Path(tmp) / f"run{rep}_{i}")
                times[code].append(result["seconds_per_unit_time"])
                print(json.dumps({"repeat": rep, **result}), flush=True)
    median = {code: statistics.median(v) for code, v in times.items()}
    print(json.dumps({"L": args.L, "n_samples": args.n_samples, "t_end": args.t_end, "python": platform.python_version(),
                      "seconds_per_unit_time": times, "median": median,
                      "ratio_to_netket": {code: median[code] / median["netket"] for code in codes if code != "netket"}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
