"""Random dense Jacobians with a spread spectrum, centred over the samples as the VMC core's are, and
their sample-space kernels in chunks (the preconditioner tests)."""

import jax
import jax.numpy as jnp
import numpy as np

from runner.core.precond_types import SampleChunks, from_dense


def random_jacobian(seed, n_params, n_samples, mode, dtype=jnp.float64):
    """A dense Obar with a spread spectrum (a few large directions, like real log-derivatives)."""
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(seed), 3)
    weights = jnp.geomspace(3.0, 0.01, n_params)
    Obar = jax.random.normal(k1, (n_params, n_samples)) * weights[:, None]
    eps = jax.random.normal(k2, (n_samples,))
    if mode == "holomorphic":
        Obar = Obar + 1j * jax.random.normal(k3, (n_params, n_samples)) * weights[:, None]
        eps = eps * (1 + 0.3j)
        dtype = {jnp.float64: jnp.complex128, jnp.float32: jnp.complex64}[dtype]
    return (Obar / jnp.sqrt(n_samples)).astype(dtype), (eps / jnp.sqrt(n_samples)).astype(dtype)


# Modes of the sample-space problem: real parameters with a real or a complex log psi (then A
# stacks the real and imaginary parts: twice the samples), and holomorphic.
MINSR_MODES = {"real": ("real", "real"), "real_complex_logpsi": ("holomorphic", "real"),
               "holomorphic": ("holomorphic", "holomorphic")}


def centred_jacobian(seed, n_params, n_samples, kind):
    """A random Obar and eps, centred over the samples as the VMC core's are."""
    Obar, eps = random_jacobian(seed, n_params, n_samples, MINSR_MODES[kind][0])
    return Obar - Obar.mean(axis=1, keepdims=True), eps - eps.mean()


def chunked(Obar_PxS, mode, n_chains, n_chunks):
    """A Jacobian of the dense Obar whose sample-space kernel is built from `n_chunks` chunks."""
    P, S = Obar_PxS.shape
    t = S // n_chains // n_chunks
    rows_CxTxP = Obar_PxS.T.reshape(n_chains, S // n_chains, P)
    chunks = SampleChunks(
        n_chunks, lambda: lambda k: jax.lax.dynamic_slice_in_dim(rows_CxTxP, k * t, t, axis=1))
    return from_dense(Obar_PxS, mode)._replace(n_chains=n_chains, chunks=chunks)


def assert_close(x, expected, rtol):
    np.testing.assert_allclose(np.asarray(x), expected, rtol=0, atol=rtol * np.abs(expected).max())
