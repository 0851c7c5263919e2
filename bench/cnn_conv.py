#!/usr/bin/env python
"""The CNN's convolution: XLA's convolution of the padded grid (`models.cnn.grid_conv`, what the
model runs) against the formulation it replaced (every cell's kernel window gathered through
`neighbour_table`, then one matrix product), in one process, jitted, on the same inputs:

    python bench/cnn_conv.py [--L 6] [--channels 8] [--depth 3] [--batch 36864]

Prints the time of log psi of `batch` configurations (36,864 = the 512 samples of
experiment=j1j2_square_cnn times 72 connected configurations each), of one batch of 32 (a sampler
step of 32 chains), and of the per-sample log-derivatives of 512 samples, for float64, complex128
and complex64 parameters (complex64's convolution runs as one real one of stacked real and
imaginary parts), with the largest difference between the two formulations.
"""

import argparse
import sys
from pathlib import Path
from unittest import mock

from runner import parallel

parallel.configure_runtime()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from models import cnn  # noqa: E402
from models.cnn import CNN  # noqa: E402
from runner import hilbert as hb  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import seconds  # noqa: E402


def gathered(model: CNN):
    """log psi of `model`'s parameters with every convolution as `models.cnn.gather_conv` (the
    model traced with it in place of `grid_conv`; call under jit or grad, which trace here)."""
    def logpsi(params, sigma_xN):
        with mock.patch.object(cnn, "grid_conv", cnn.gather_conv):
            return model.apply({"params": params}, sigma_xN)
    return logpsi


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--L", type=int, default=6)
    parser.add_argument("--channels", type=int, default=8)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--batch", type=int, default=36864)
    args = parser.parse_args()
    jax.config.update("jax_enable_x64", True)
    lattice = hb.square(args.L, total_sz=0)
    sigma = jnp.where(jax.random.bernoulli(jax.random.PRNGKey(1), 0.5, (args.batch, lattice.n_sites)), 1, -1)
    sigma = sigma.astype(jnp.int8)
    print(f"{args.L} x {args.L} square lattice, CNN channels {args.channels}, depth {args.depth}, 3 x 3 kernels; "
          f"jax {jax.__version__}")
    for dtype in (jnp.float64, jnp.complex128, jnp.complex64):
        model = CNN(channels=args.channels, depth=args.depth, param_dtype=dtype, hilbert=lattice)
        params = model.init(jax.random.PRNGKey(0), sigma[:1])["params"]
        ways = {"grid_conv": lambda p, s: model.apply({"params": p}, s), "gather": gathered(model)}
        rows = {}
        for name, logpsi in ways.items():
            grad = jax.grad(lambda p, s, f=logpsi: jnp.real(f(p, s[None])[0]))
            rows[name] = (seconds(jax.jit(logpsi), params, sigma),
                          seconds(jax.jit(logpsi), params, sigma[:32]),
                          seconds(jax.jit(jax.vmap(grad, in_axes=(None, 0))), params, sigma[:512]))
        diff = float(jnp.max(jnp.abs(rows["grid_conv"][0][1] - rows["gather"][0][1])))
        print(f"{jnp.dtype(dtype).name}: max |log psi difference| {diff:.1e}")
        for name, ((t_batch, _), (t_32, _), (t_jac, _)) in rows.items():
            print(f"  {name:9s}  log psi of {args.batch}: {t_batch * 1e3:8.1f} ms   of 32: {t_32 * 1e3:6.2f} ms   "
                  f"per-sample derivatives of 512: {t_jac * 1e3:7.1f} ms")


if __name__ == "__main__":
    main()
