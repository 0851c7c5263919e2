#!/usr/bin/env python
"""The real log cosh with XLA's log1p against the runner's (`models.common.log_cosh`: atanh's
series, `log1p_unit`), alone and inside the CNN, in one process, jitted, on the same inputs:

    python bench/log_cosh.py [--L 6] [--channels 8] [--depth 2] [--elements 663552]

Prints nanoseconds per element of log cosh of `--elements` normal numbers (float64, float32), and
microseconds per configuration of the CNN's log psi (float64 parameters) with each: 16
configurations per step of a 756-step scan (the sampler's pattern: one proposal of 16 chains per
step) and one batch of 2,304 (one block of the local energies of 256 samples).
"""

import argparse
import sys
from pathlib import Path
from unittest import mock

from runner.parallel import runtime

runtime.configure_runtime()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from models import common  # noqa: E402
from models.cnn import CNN  # noqa: E402
from runner.physics import hilbert as hb  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import seconds  # noqa: E402


def with_log1p(x):
    """The real log cosh as it was: |x| + log1p(exp(-2|x|)) - log 2 with XLA's log1p."""
    x = jnp.abs(x)
    return x + jnp.log1p(jnp.exp(-2.0 * x)) - jnp.log(2.0).astype(x.dtype)


FORMS = {"XLA's log1p": with_log1p, "log1p_unit": common.log_cosh}


def cnn_logpsi(model: CNN, form: str):
    """The CNN's log psi with its activation log cosh computed by FORMS[form] (traced here)."""
    def logpsi(params, sigma_xN):
        swapped = {"log_cosh": common.Activation(FORMS[form], common.ACTIVATIONS["log_cosh"].init_gain)}
        with mock.patch.dict(common.ACTIVATIONS, swapped):
            return model.apply({"params": params}, sigma_xN)
    return logpsi


def scan_of(logpsi, n_steps):
    """`n_steps` evaluations of a batch in sequence, each configuration's spins flipped where its
    log psi grew (so no evaluation can be hoisted out of the loop)."""
    def run(params, sigma_xN):
        def step(carry, _):
            sigma, last = carry
            value = logpsi(params, sigma)
            return (jnp.where((value > last)[:, None], -sigma, sigma), value), None
        return jax.lax.scan(step, (sigma_xN, jnp.zeros(sigma_xN.shape[0])), None, length=n_steps)[0]
    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--L", type=int, default=6)
    parser.add_argument("--channels", type=int, default=8)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--elements", type=int, default=2304 * 288)
    parser.add_argument("--scan", type=int, nargs=2, default=[16, 756], help="configurations per step, steps")
    parser.add_argument("--batch", type=int, default=2304)
    args = parser.parse_args()
    jax.config.update("jax_enable_x64", True)
    x = 2.0 * jax.random.normal(jax.random.PRNGKey(0), (args.elements,), jnp.float64)
    print(f"jax {jax.__version__}; log cosh of {args.elements} normal numbers (sd 2), ns per element")
    for dtype in (jnp.float64, jnp.float32):
        xs = x.astype(dtype)
        reference = jnp.abs(xs.astype(jnp.float64))  # the error of each form against the float64 log1p
        reference = reference + jnp.log1p(jnp.exp(-2.0 * reference)) - jnp.log(2.0)
        for name, fn in FORMS.items():
            t, out = seconds(jax.jit(fn), xs, repeat=20)
            print(f"  {jnp.dtype(dtype).name} {name:12s} {t / args.elements * 1e9:7.2f} ns"
                  f"   max |difference from float64 log1p| {float(jnp.max(jnp.abs(out - reference))):.1e}")
    lattice = hb.square(args.L, total_sz=0)
    model = CNN(channels=args.channels, depth=args.depth, param_dtype=jnp.float64, hilbert=lattice)
    sigma = jnp.where(jax.random.bernoulli(jax.random.PRNGKey(1), 0.5, (args.batch, lattice.n_sites)), 1, -1)
    sigma = sigma.astype(jnp.int8)
    params = model.init(jax.random.PRNGKey(2), sigma[:1])["params"]
    per_step, n_steps = args.scan
    print(f"{args.L} x {args.L} CNN, channels {args.channels}, depth {args.depth}, float64; us per configuration")
    values = {}
    for name in FORMS:
        logpsi = cnn_logpsi(model, name)
        t_scan, _ = seconds(jax.jit(scan_of(logpsi, n_steps)), params, sigma[:per_step], repeat=5)
        t_batch, values[name] = seconds(jax.jit(logpsi), params, sigma, repeat=10)
        print(f"  {name:12s} {per_step} per step of a {n_steps}-step scan {t_scan / n_steps / per_step * 1e6:6.2f}"
              f"   one batch of {args.batch} {t_batch / args.batch * 1e6:6.2f}")
    first, second = values.values()
    print(f"  max |log psi difference| {float(jnp.max(jnp.abs(first - second))):.1e}")


if __name__ == "__main__":
    main()
