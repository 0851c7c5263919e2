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


def real_times(x, w):
    """x @ w for real x and real or complex w.

    With complex w this is one real product with [Re w, Im w] side by side: XLA's complex
    matrix product is several times slower on CPU, and x has no imaginary part to multiply.
    """
    if not jnp.iscomplexobj(w):
        return x @ w
    if w.ndim == 1:
        return jax.lax.complex(x @ jnp.real(w), x @ jnp.imag(w))
    m = w.shape[-1]
    both = x @ jnp.concatenate([jnp.real(w), jnp.imag(w)], axis=-1)
    return jax.lax.complex(both[..., :m], both[..., m:])


def log_cosh(x):
    """log(cosh(x)), stable for large |Re x| and holomorphic for complex x.

    Complex inputs are computed in real arithmetic: XLA's complex log1p is a slow scalar
    path on CPU, and this form is about 1.6x faster with the same principal branch.
    """
    if not jnp.iscomplexobj(x):
        x = jnp.abs(x)
        return x + jnp.log1p(jnp.exp(-2.0 * x)) - jnp.log(2.0).astype(x.dtype)
    a, b, e, w_re, w_im = _cosh_parts(x)
    real = a - jnp.log(2.0).astype(a.dtype) + 0.5 * jnp.log1p(2.0 * w_re + e * e)
    return jax.lax.complex(real, b + jnp.arctan2(w_im, 1.0 + w_re))


def log_cosh_real_part(x):
    """Re log(cosh(x)): all a Metropolis ratio needs, at half the cost for complex x."""
    if not jnp.iscomplexobj(x):
        return log_cosh(x)
    a, _, e, w_re, _ = _cosh_parts(x)
    return a - jnp.log(2.0).astype(a.dtype) + 0.5 * jnp.log1p(2.0 * w_re + e * e)


def _cosh_parts(x):
    """For z = s*x with Re z >= 0: (Re z, Im z, |w|, Re w, Im w) with w = exp(-2z), |w| <= 1.

    log cosh x = z - log 2 + log(1 + w), and log(1 + w) = log1p(2 Re w + |w|^2)/2 + i arg(1 + w).
    """
    s = jnp.where(jnp.real(x) < 0, -1.0, 1.0).astype(jnp.real(x).dtype)
    a, b = jnp.real(x) * s, jnp.imag(x) * s
    e = jnp.exp(-2.0 * a)
    return a, b, e, e * jnp.cos(2.0 * b), -e * jnp.sin(2.0 * b)
