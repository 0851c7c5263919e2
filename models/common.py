"""Shared pieces of the wavefunction models: dtype checks, initialisers, activations."""

import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from runner.errors import ConfigError, require_choice

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


# sin and cos of one argument with one range reduction (x = k pi/2 + r, |r| <= pi/4) and the
# minimax polynomials of Cephes' sinf/cosf and sin/cos on [-pi/4, pi/4]: XLA:CPU computes
# jnp.sin and jnp.cos each with its own reduction, which made them most of a complex log cosh.
_PIO2_F32 = (1.5703125, 4.837512969970703125e-4, 7.54978995489188216e-8)  # float32 parts of pi/2
_PIO2_F64 = (1.57079632673412561417e0, 6.07710050650619224932e-11)        # fdlibm's pio2_1, pio2_1t
_SIN_F32 = (-1.6666654611e-1, 8.3321608736e-3, -1.9515295891e-4)
_COS_F32 = (4.166664568298827e-2, -1.388731625493765e-3, 2.443315711809948e-5)
_SIN_F64 = (-1.66666666666666307295e-1, 8.33333333332211858878e-3, -1.98412698295895385996e-4,
            2.75573136213857245213e-6, -2.50507477628578072866e-8, 1.58962301576546568060e-10)
_COS_F64 = (4.16666666666665929218e-2, -1.38888888888730564116e-3, 2.48015872888517045348e-5,
            -2.75573141792967388112e-7, 2.08757008419747316778e-9, -1.13585365213876817300e-11)


def _horner(z, coefficients):
    out = jnp.zeros_like(z) + coefficients[-1]
    for c in coefficients[-2::-1]:
        out = out * z + c
    return out


def sincos(x):
    """(sin x, cos x) of a real array, to about 1 ulp for |x| < 1e5 (float32: the reduction is
    done in float64 under x64, so any |x| < 1e9) and 1e6 (float64)."""
    k = jnp.round(x * (2 / math.pi))
    if x.dtype == jnp.float32:
        if jax.config.jax_enable_x64:
            r = (x.astype(jnp.float64) - k.astype(jnp.float64) * (math.pi / 2)).astype(jnp.float32)
        else:
            r = x - k * _PIO2_F32[0] - k * _PIO2_F32[1] - k * _PIO2_F32[2]
        sin_c, cos_c = _SIN_F32, _COS_F32
    else:
        r = x - k * _PIO2_F64[0] - k * _PIO2_F64[1]
        sin_c, cos_c = _SIN_F64, _COS_F64
    z = r * r
    s = r + r * z * _horner(z, sin_c)
    c = 1.0 - 0.5 * z + z * z * _horner(z, cos_c)
    quadrant = k.astype(jnp.int32) & 3  # x = k pi/2 + r: sin x = s, c, -s, -c and cos x = c, -s, -c, s
    sin = jnp.where(quadrant == 0, s, jnp.where(quadrant == 1, c, jnp.where(quadrant == 2, -s, -c)))
    cos = jnp.where(quadrant == 0, c, jnp.where(quadrant == 1, -s, jnp.where(quadrant == 2, -c, s)))
    return sin, cos


# arctan on [-tan(pi/8), tan(pi/8)] as r + r^3 P(r^2), P fitted here (a Chebyshev least-squares
# fit of (arctan r - r) / r^3, scripts/fit_arctan.py): at most 2.4e-9 (float32, degree 4) and 5.2e-17
# (float64, degree 10) from arctan r / r. XLA:CPU's own jnp.arctan and jnp.arctan2 took 5.5 and
# 11.7 ns per float32 element (exp: 0.2, this arctan2: 1.3): they were most of a complex64 log cosh,
# and of the 6 x 6 CNN's step (docs/notes/benchmarks.md).
_ATAN_F32 = (-0.33333331813419265, 0.199995500759138, -0.14264232553022016, 0.1074629843409055,
             -0.06459376277461908)
_ATAN_F64 = (-0.3333333333333333, 0.19999999999995946, -0.14285714284766368, 0.11111111022973698,
             -0.09090904872848717, 0.07692189664107314, -0.06664598590542287, 0.058588794651619494,
             -0.05089167387556515, 0.03933670600600766, -0.019303261979156997)
_TAN_PI_8 = math.tan(math.pi / 8)


def arctan2(y, x):
    """arctan2(y, x) of real arrays (principal value in [-pi, pi]), in vectorisable arithmetic:
    t = min(|y|, |x|) / max(|y|, |x|) in [0, 1], then arctan t = pi/4 + arctan((t - 1) / (t + 1))
    above tan(pi/8), and the polynomial on what is left. Within 2 ulp of the correctly rounded
    value; 0 where x = y = 0 (NumPy: 0 or pi by the zeros' signs); NaN in, NaN out."""
    coefficients = _ATAN_F32 if y.dtype == jnp.float32 else _ATAN_F64
    ay, ax = jnp.abs(y), jnp.abs(x)
    big, small = jnp.maximum(ay, ax), jnp.minimum(ay, ax)
    big = jnp.where(big > 0, big, 1.0)
    upper = small > _TAN_PI_8 * big
    r = jnp.where(upper, (small - big) / (small + big), small / big)
    z = r * r
    angle = r + r * z * _horner(z, coefficients) + jnp.where(upper, math.pi / 4, 0.0)
    angle = jnp.where(ay > ax, math.pi / 2 - angle, angle)
    angle = jnp.where(x < 0, math.pi - angle, angle)
    return jnp.where(y < 0, -angle, angle).astype(y.dtype)


def _exp_minus_2z(a, b):
    """(Re w, Im w) of w = exp(-2 (a + i b)), sin and cos of 2b from one `sincos`."""
    e = jnp.exp(-2.0 * a)
    sin_2b, cos_2b = sincos(2.0 * b)
    return e * cos_2b, -e * sin_2b


# log(1 + e) for e in [0, 1] as 2 atanh(s), s = e / (2 + e) in [0, 1/3], by atanh's series
# s (1 + s^2/3 + s^4/5 + ...): its terms fall by s^2 <= 1/9, so 16 of them are within 1e-17 of
# the sum (float32: 7, 1e-8). XLA:CPU's float64 log1p was most of a real CNN's evaluation
# (docs/notes/benchmarks.md, "log cosh without log1p").
_ATANH_F64 = tuple(1.0 / (2 * k + 1) for k in range(16))
_ATANH_F32 = _ATANH_F64[:7]


def log1p_unit(e):
    """log(1 + e) of a real array with 0 <= e <= 1 (not checked), in vectorisable arithmetic,
    within 2 ulp of log 2 of the exact value.

    Written as 2 e P(s^2) / (2 + e), the division last: XLA:CPU copies a chain of products and
    sums into every consumer of its result (a CNN layer's nine window slices: the series was
    computed nine times), but keeps an expensive operation such as a division in one place.
    """
    d = 2.0 + e
    s = e / d
    return 2.0 * e * _horner(s * s, _ATANH_F32 if e.dtype == jnp.float32 else _ATANH_F64) / d


def log_cosh(x):
    """log(cosh(x)) elementwise, stable for large |Re x| and holomorphic for complex x.

    Real inputs as |x| - log 2 + log(1 + exp(-2|x|)) with `log1p_unit`; complex inputs in real
    arithmetic too: XLA's complex log1p is a slow scalar path on CPU, and this form is faster
    (docs/notes/benchmarks.md) with the same principal branch.
    """
    if not jnp.iscomplexobj(x):
        a = jnp.abs(x)
        log2 = jnp.log(2.0).astype(a.dtype)
        # Beyond |x| = 20, exp(-2|x|) < 5e-18 is below half an ulp of |x| (float32 and float64):
        # the select gives the same bits. It also ends the elementwise chain with an operation
        # XLA:CPU's YNNPACK fusions do not take, which otherwise pulled the whole series into
        # a fusion with the next matrix product, each coefficient broadcast to a full array
        # (the ViT's local energies took 1.4x longer).
        return jnp.where(a > 20.0, a - log2, a + log1p_unit(jnp.exp(-2.0 * a)) - log2)
    s = jnp.where(jnp.real(x) < 0, -1.0, 1.0).astype(jnp.real(x).dtype)
    a, b = jnp.real(x) * s, jnp.imag(x) * s  # z = s x has Re z >= 0; w = exp(-2z), |w| <= 1
    w_re, w_im = _exp_minus_2z(a, b)
    # log(1 + w) = log|1 + w|^2 / 2 + i arg(1 + w). |1 + w|^2 as a sum of squares: written
    # 1 + 2 Re w + |w|^2 it rounds below 0 near the poles (complex64: NaN log psi within 14
    # steps of a 6 x 6 CNN run). arg(1 + w) by the vectorisable `arctan2`.
    den = 1.0 + w_re
    real = a - jnp.log(2.0).astype(a.dtype) + 0.5 * jnp.log(den * den + w_im * w_im)
    return jax.lax.complex(real, b + arctan2(w_im, den))


class Activation(NamedTuple):
    f: Callable
    """The elementwise nonlinearity."""
    init_gain: float
    """Weights start at init_gain / sqrt(fan-in)."""


ACTIVATIONS = {"log_cosh": Activation(log_cosh, 1.0)}


def activation(name: str) -> Activation:
    """The activation called `name` (a key of ACTIVATIONS), else a ConfigError."""
    return ACTIVATIONS[require_choice("activation", name, ACTIVATIONS)]


# --- Re log psi for the sampler: one logarithm per block instead of one per element --------
#
# sum_j Re log cosh x_j = sum_j |Re x_j| - M log 2 + log prod_j f_j / 2, with
# f_j = |1 + exp(-2 z_j)|^2 = 1 + 2 e_j cos(2 Im x_j) + e_j^2, e_j = exp(-2 |Re x_j|),
# z_j = sign(Re x_j) x_j. Every f_j is at most 4, so a block of LOG_PROD_BLOCK factors cannot
# overflow. Inside the Metropolis loop (a few hundred elements per step) the product beats a
# log1p per element; on large real batches the elementwise `log_cosh` wins instead, so
# `sum_log_cosh` keeps it there; for complex batches the product (one complex log per row
# instead of a log1p and an arctan2 per element) is the cheaper one. The timings behind these
# choices are in docs/notes/benchmarks.md ("Where the time goes").

LOG_PROD_BLOCK = 256


def log_prod(f_xM):
    """sum of log f over the last axis, as logs of blocked products (0 < |f| <= 4)."""
    m = f_xM.shape[-1]
    if m <= LOG_PROD_BLOCK:
        return jnp.log(jnp.prod(f_xM, axis=-1))
    n_blocks = -(-m // LOG_PROD_BLOCK)
    pad = [(0, 0)] * (f_xM.ndim - 1) + [(0, n_blocks * LOG_PROD_BLOCK - m)]
    f = jnp.pad(f_xM, pad, constant_values=1).reshape(*f_xM.shape[:-1], n_blocks, LOG_PROD_BLOCK)
    return jnp.sum(jnp.log(jnp.prod(f, axis=-1)), axis=-1)


def sum_log_cosh_real_part(x_xM):
    """sum over the last axis of Re log cosh(x): all a Metropolis ratio needs."""
    m = x_xM.shape[-1]
    a = jnp.abs(jnp.real(x_xM))
    e = jnp.exp(-2.0 * a)
    if jnp.iscomplexobj(x_xM):
        f = jnp.maximum(1.0 + e * (2.0 * jnp.cos(2.0 * jnp.imag(x_xM)) + e), 0.0)  # rounding near a pole
    else:
        f = (1.0 + e) ** 2
    return jnp.sum(a, axis=-1) - m * jnp.log(2.0).astype(a.dtype) + 0.5 * log_prod(f)


@jax.custom_jvp
def sum_log_cosh(x_xM):
    """sum over the last axis of log cosh(x); holomorphic for complex x.

    For complex x the imaginary part is exact modulo 2 pi (all that amplitudes exp(log psi)
    and their ratios see); the derivative is exact (tanh x).
    """
    if not jnp.iscomplexobj(x_xM):
        return jnp.sum(log_cosh(x_xM), axis=-1)
    z = jnp.where(jnp.real(x_xM) < 0, -x_xM, x_xM)
    w = jax.lax.complex(*_exp_minus_2z(jnp.real(z), jnp.imag(z)))
    log2 = x_xM.shape[-1] * jnp.log(2.0).astype(w.real.dtype)
    return jnp.sum(z, axis=-1) - log2 + log_prod(1.0 + w)  # |1 + w| <= 2


@sum_log_cosh.defjvp
def _sum_log_cosh_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    return sum_log_cosh(x), jnp.sum(jnp.tanh(x) * dx, axis=-1)


ATTACHED_WEIGHT = 1.0  # plus_x: each unit's one weight (tanh 0.76: log-derivatives of order 1)


def attached(kernel_NxM):
    """A kernel [N, M] of `kernel`'s dtype whose unit m sees site m mod N alone, with weight
    ATTACHED_WEIGHT: with zero bias, log cosh(w s_m) = log cosh(w) on every configuration (psi
    uniform), while the unit's log-derivatives in its weights, tanh(w s_m) s_k = tanh(w) s_m s_k,
    hold every two-body term (and in its bias, tanh(w) s_m, every one-body term): the `plus_x`
    of the models built on log cosh of linear maps of the spins."""
    n, m = kernel_NxM.shape
    mine = (jnp.arange(n)[:, None] == jnp.arange(m)[None, :] % n)
    return jnp.where(mine, ATTACHED_WEIGHT, 0).astype(kernel_NxM.dtype)
