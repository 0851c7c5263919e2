#!/usr/bin/env python
"""Noise-free SR on the 4 x 4 J1-J2 model: what the space-group RBM reaches without Monte Carlo.

A diagnostic for docs/notes/accuracy.md; the runner's own `sampler=full_sum` now does these sums for
every model (experiment=j1j2_square_full_sum). The model is the runner's own
`models.RBMSymm(group="lattice")` (complex, Marshall-rotated Hamiltonian, Sz = 0), optimised by
plain SR with every expectation value summed exactly over the sector instead of sampled. The
model's log psi is invariant under the 128 space-group elements and H commutes with them, so psi,
E_loc and the log-derivatives are constant on each orbit: the sums run over the 153 orbits of the
12,870 configurations, each weighted by its size (the same numbers as the sum over all states,
about 100x faster). The update is SR's: theta -= lr (S + diag_shift)^-1 F with
F = <O* (E_loc - E)>, S = <O* O> - <O*><O>, from the seed's initial parameters (the runner's F
carries NetKet's factor 2, so there the same lr is twice this step).

    python bench/noise_free_sr.py --alpha 8 --steps 1000
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runner.parallel.runtime import configure_runtime  # noqa: E402

configure_runtime()

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.flatten_util import ravel_pytree  # noqa: E402

from models import RBMSymm, fast_paths  # noqa: E402
from runner.core import local_energy  # noqa: E402
from runner.core import sampler as smp  # noqa: E402
from runner.physics import exact, hamiltonians
from runner.physics import hilbert as hb  # noqa: E402


def orbits(lattice):
    """One configuration per space-group orbit of the Sz = 0 sector, and the orbit sizes
    (`runner.core.sampler.orbits`, which `sampler=full_sum sampler.symmetry=lattice` sums over)."""
    states = hb.all_states(lattice)
    reps, sizes = smp.orbits(states, np.asarray(lattice.space_group))
    return jnp.asarray(reps, jnp.int8), jnp.asarray(sizes, jnp.float64), len(states)


def weighted_local_energies(ham, model, params, states, sizes):
    """(w, E_loc) on the orbit representatives: w = size |psi|^2, normalised, so that
    sum w E_loc is the energy of the whole sector (E_loc by the model's local ratios)."""
    logpsi = lambda p, s: model.apply({"params": p}, s)  # noqa: E731
    log_psi = logpsi(params, states)
    w = sizes * jnp.exp(2 * (log_psi.real - log_psi.real.max()))
    ratio = fast_paths.resolve(model).ratio
    eloc = jax.vmap(lambda s: local_energy.local_energy(ham, logpsi, params, s, ratio_fn=ratio))(states)
    return w / w.sum(), eloc


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--alpha", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=0.01)
    parser.add_argument("--diag-shift", type=float, default=0.01)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    lattice = hb.square(4, total_sz=0)
    ham = hamiltonians.heisenberg(lattice, 1.0, 0.5, "marshall")
    model = RBMSymm(alpha=args.alpha, group="lattice", param_dtype=jnp.complex128, hilbert=lattice)
    states, sizes, n_states = orbits(lattice)
    key = jax.random.fold_in(jax.random.PRNGKey(args.seed), 2**31 - 1)  # as runner.core.vmc.init_state
    flat, unravel = ravel_pytree(model.init(key, states[0])["params"])
    exact_energy = exact.ground_energy(ham, lattice)
    logpsi = lambda f, s: model.apply({"params": unravel(f)}, s)  # noqa: E731

    @jax.jit
    def step(flat):
        w, eloc = weighted_local_energies(ham, model, unravel(flat), states, sizes)
        energy = jnp.sum(w * eloc)
        O = jax.vmap(jax.grad(logpsi, holomorphic=True), in_axes=(None, 0))(flat, states)
        Obar = O - jnp.sum(w[:, None] * O, axis=0)
        S = (jnp.conj(Obar) * w[:, None]).T @ Obar
        F = (jnp.conj(Obar) * w[:, None]).T @ (eloc - energy)
        x = jnp.linalg.solve(S + args.diag_shift * jnp.eye(len(flat)), F)
        return flat - args.learning_rate * x, energy.real, jnp.sum(w * jnp.abs(eloc - energy) ** 2)

    print(f"alpha {args.alpha}: {len(flat)} parameters; {len(states)} orbits of {n_states} configurations")
    print("step  energy  relative_error  variance  wall_s")
    start = time.perf_counter()
    for i in range(args.steps):
        flat, energy, variance = step(flat)
        if i % 100 == 0 or i == args.steps - 1:
            energy = float(energy)
            print(f"{i} {energy:.6f} {(energy - exact_energy) / abs(exact_energy):.2e} {float(variance):.4f} "
                  f"{time.perf_counter() - start:.1f}", flush=True)


if __name__ == "__main__":
    main()
