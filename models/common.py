"""Shared pieces of the wavefunction models: dtype checks, initialisers, activations."""

import jax
import jax.numpy as jnp

from runner.errors import ConfigError

PARAM_DTYPES = ("float64", "float32", "complex128", "complex64")


def check_param_dtype(param_dtype):
    """Refuses anything but the four supported parameter dtypes."""
    if jnp.dtype(param_dtype).name not in PARAM_DTYPES:
        raise ConfigError("param_dtype", f"must be one of {', '.join(PARAM_DTYPES)} (got {param_dtype})")


def normal(stddev):
    """Normal initialiser; complex dtypes get independent real and imaginary parts."""

    def init(key, shape, dtype):
        dtype = jnp.dtype(dtype)
        if jnp.issubdtype(dtype, jnp.complexfloating):
            real = jnp.finfo(dtype).dtype
            k1, k2 = jax.random.split(key)
            parts = jax.random.normal(k1, shape, real), jax.random.normal(k2, shape, real)
            return (stddev / jnp.sqrt(2.0) * (parts[0] + 1j * parts[1])).astype(dtype)
        return stddev * jax.random.normal(key, shape, dtype)

    return init


def log_cosh(x):
    """log(cosh(x)), stable for large |Re x| and holomorphic for complex x."""
    sign = jnp.where(jnp.real(x) < 0, -1, 1).astype(x.dtype)
    x = x * sign
    return x + jnp.log1p(jnp.exp(-2.0 * x)) - jnp.log(2.0).astype(x.dtype)
