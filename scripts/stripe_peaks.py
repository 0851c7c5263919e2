"""Does a saved square-lattice run put its weight where its samples never go?

For each run directory: log|psi| of every stripe-domain configuration (L/2 whole rows or
columns up, the rest down: Sz = 0), against log|psi| of 2,048 fresh samples of |psi|^2, and
E_loc at the largest. A Metropolis chain of local exchanges almost never reaches these
configurations from typical ones, so a state can put nearly all of |psi|^2 on them while every
sampled estimate says otherwise (docs/notes/accuracy.md, "Sampled 6x6 energies that were wrong").

    python scripts/stripe_peaks.py RUN_DIR [RUN_DIR ...]
"""

import itertools
import sys

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import runner  # noqa: E402


def stripe_domains(L):
    """The configurations [K, L*L] with L/2 whole columns (or rows) up and the rest down."""
    configs = []
    for cols in itertools.combinations(range(L), L // 2):
        c = -np.ones((L, L), np.int8)
        c[:, list(cols)] = 1
        configs += [c.reshape(-1), c.T.reshape(-1)]
    return np.array(configs)


def main(run_dirs):
    for run_dir in run_dirs:
        run = runner.load(run_dir)
        L = int(round(run.hilbert.n_sites ** 0.5))
        stripes = stripe_domains(L)
        log_abs_K = np.real(np.asarray(run.log_psi(jnp.asarray(stripes))))
        samples = np.asarray(run.sample(2048)).reshape(-1, L * L)
        log_abs_S = np.real(np.asarray(run.log_psi(jnp.asarray(samples))))
        k = int(np.argmax(log_abs_K))
        eloc = complex(run.local_energies(stripes[k:k + 1])[0])
        n_at_max = int(np.sum(log_abs_K > log_abs_K[k] - 1e-6))
        print(f"{run_dir} (step {run.step}): largest log|psi| of a stripe domain {log_abs_K[k]:.2f} "
              f"({n_at_max} configurations), of 2048 samples {log_abs_S.max():.2f} (median {np.median(log_abs_S):.2f}): "
              f"|psi|^2 ratio e^{2 * (log_abs_K[k] - log_abs_S.max()):.1f}; E_loc there {eloc.real:.5f}")


if __name__ == "__main__":
    main(sys.argv[1:])
