#!/usr/bin/env python
"""The CNN's convolution in each of its formulations (`models.cnn.grid_conv`'s forms: XLA's
convolution of the padded grid, every cell's window stacked from slices and one product, one
product with the layer's matrix over all cells) and as the model chooses (`models.cnn.conv_form`),
in one process, jitted, on the same inputs:

    python bench/cnn_conv.py [--L 6] [--channels 8] [--depth 2] [--batches 16 128 2304 36864]

Prints, for float64, float32, complex128 and complex64 parameters, the time of log psi per
configuration for each batch (16: one sampler proposal of 16 chains; 2,304: one block of the
local energies of 256 samples; 36,864: all 144 connected configurations of 256 samples) and of
the per-sample log-derivatives of 256 samples, with the largest difference from XLA's form.
"""

import argparse
import sys
from pathlib import Path
from unittest import mock

from runner.parallel import runtime

runtime.configure_runtime()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from models import cnn  # noqa: E402
from models.cnn import CNN  # noqa: E402
from runner.physics import hilbert as hb  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import seconds  # noqa: E402


def in_form(model: CNN, form: str | None):
    """log psi of `model`'s parameters with every convolution in `form` (None: the model's own
    choice; call under jit or grad, which trace here)."""
    def logpsi(params, sigma_xN):
        choose = cnn.conv_form if form is None else (lambda *shape: form)
        with mock.patch.object(cnn, "conv_form", choose):
            return model.apply({"params": params}, sigma_xN)
    return logpsi


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--L", type=int, default=6)
    parser.add_argument("--channels", type=int, default=8)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 128, 2304, 36864])
    parser.add_argument("--derivatives", type=int, default=256, help="samples of the per-sample log-derivatives")
    args = parser.parse_args()
    jax.config.update("jax_enable_x64", True)
    lattice = hb.square(args.L, total_sz=0)
    sigma = jnp.where(jax.random.bernoulli(jax.random.PRNGKey(1), 0.5, (max(args.batches), lattice.n_sites)), 1, -1)
    sigma = sigma.astype(jnp.int8)
    print(f"{args.L} x {args.L} square lattice, CNN channels {args.channels}, depth {args.depth}, 3 x 3 kernels; "
          f"jax {jax.__version__}; microseconds per configuration")
    for dtype in (jnp.float64, jnp.float32, jnp.complex128, jnp.complex64):
        model = CNN(channels=args.channels, depth=args.depth, param_dtype=dtype, hilbert=lattice)
        params = model.init(jax.random.PRNGKey(0), sigma[:1])["params"]
        print(f"{jnp.dtype(dtype).name}:")
        reference = None
        for form in ("xla", *(f for f in cnn.FORMS if f != "xla"), None):  # XLA's first: the reference
            logpsi = in_form(model, form)
            times = []
            for batch in args.batches:
                t, out = seconds(jax.jit(logpsi), params, sigma[:batch])
                times.append(t * 1e6 / batch)
            if form == "xla":
                reference = out
            grad = jax.grad(lambda p, s, f=logpsi: jnp.real(f(p, s[None])[0]))
            t_jac, _ = seconds(jax.jit(jax.vmap(grad, in_axes=(None, 0))), params, sigma[:args.derivatives])
            diff = float(jnp.max(jnp.abs(out - reference)))
            label = "chosen" if form is None else form
            print(f"  {label:8s} " + "  ".join(f"log psi of {b}: {t:7.2f}" for b, t in zip(args.batches, times))
                  + f"  derivatives of {args.derivatives}: {t_jac * 1e6 / args.derivatives:7.2f}"
                  + f"  max |difference from xla| {diff:.1e}")


if __name__ == "__main__":
    main()
