#!/usr/bin/env python
"""Where one VMC step's time goes, for any config: the sampler's draw, the local energies, the
energy and update (local energies, log-derivatives and the preconditioner's solve) and the whole
step, each jitted alone and timed on the run's initial state:

    python bench/step_parts.py experiment=j1j2_square_cnn sampler.n_chains=128 [--repeat 5]

Arguments are Hydra overrides of the runner's config (as for `python -m runner`). Each part is
run once to compile, then `--repeat` times; the mean wall time of those is printed in ms. The
parts overlap (the step contains all of them), so they do not add up to the step. The runner's
own process settings apply (`runner.parallel.runtime.configure_runtime`).
"""

import argparse
import sys
from pathlib import Path

from runner.parallel import distributed, mesh, runtime

runtime.configure_runtime()

import jax  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import composed_experiment, seconds  # noqa: E402


def experiment_of(overrides):
    """The runner's Experiment for `overrides`, its devices initialised."""
    experiment = composed_experiment(overrides)
    distributed.initialize(experiment.parallel, experiment.x64)
    return experiment


def mean_ms(fn, *args, repeat):
    """`bench/run.py seconds` in ms: (mean of `repeat` calls after one to compile, the output)."""
    t, out = seconds(fn, *args, repeat=repeat)
    return t * 1e3, out


def parts(experiment, repeat: int) -> dict:
    """{part: (ms, its output)} for the draw, local energies, energy and update, and the whole step."""
    from runner.lifecycle import ground_state
    from runner.core import local_energy, vmc
    from runner.core.problem import draw

    problem = experiment.problem
    layout = mesh.make_mesh(experiment.parallel["backend"])
    state, _ = ground_state.place_state(problem, experiment.settings, layout)
    out = {"draw": mean_ms(jax.jit(lambda params, chains: draw(problem, params, chains)),
                           state.params, state.chains, repeat=repeat)}
    _, sigma, weights, _ = out["draw"][1]
    out["local_energies"] = mean_ms(jax.jit(lambda params, s: local_energy.local_energies(problem, params, s)),
                                    state.params, sigma, repeat=repeat)
    out["energy_and_update"] = mean_ms(
        jax.jit(lambda params, s, w, solver: vmc.energy_and_update(problem, params, s, solver, 0, w)),
        state.params, sigma, weights, state.solver, repeat=repeat)
    out["vmc_step"] = mean_ms(jax.jit(lambda st: vmc.vmc_step(problem, st)), state, repeat=repeat)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    args, overrides = parser.parse_known_args(argv)
    experiment = experiment_of(overrides)
    print(f"{' '.join(overrides)}: jax {jax.__version__}, {jax.device_count()} device(s)")
    for name, (ms, _) in parts(experiment, args.repeat).items():
        print(f"  {name:18s} {ms:9.1f} ms")


if __name__ == "__main__":
    main(sys.argv[1:])
