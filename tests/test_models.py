"""Wavefunction models: shapes, dtypes, holomorphy, numerically stable activations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from models import MLP, RBM, Jastrow
from models.common import LOG_PROD_BLOCK, log_cosh, sum_log_cosh, sum_log_cosh_real_part
from runner.errors import ConfigError

DTYPES = [jnp.float64, jnp.float32, jnp.complex128, jnp.complex64]
MODELS = [lambda d: RBM(alpha=2, param_dtype=d), lambda d: RBM(alpha=1, use_visible_bias=False, param_dtype=d),
          lambda d: Jastrow(param_dtype=d), lambda d: MLP(hidden=[6, 3], param_dtype=d)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("make", MODELS)
def test_shapes_and_dtypes(make, dtype):
    model = make(dtype)
    sigma = jnp.where(jax.random.bernoulli(jax.random.PRNGKey(0), 0.5, (3, 5, 7)), 1, -1).astype(jnp.int8)
    params = model.init(jax.random.PRNGKey(1), sigma[0, 0])["params"]
    assert all(x.dtype == jnp.dtype(dtype) for x in jax.tree_util.tree_leaves(params))
    out = model.apply({"params": params}, sigma)
    assert out.shape == (3, 5) and out.dtype == jnp.dtype(dtype)
    single = model.apply({"params": params}, sigma[1, 2])
    atol = 1e-6 if jnp.finfo(dtype).bits == 32 else 1e-14  # batched and single products round differently
    np.testing.assert_allclose(single, out[1, 2], rtol=1e-5, atol=atol)


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.complex128])
@pytest.mark.parametrize("make", MODELS)
def test_log_abs_is_the_real_part(make, dtype):
    model = make(dtype)
    sigma = jnp.where(jax.random.bernoulli(jax.random.PRNGKey(4), 0.5, (9, 7)), 1, -1).astype(jnp.int8)
    params = model.init(jax.random.PRNGKey(5), sigma[0])["params"]
    params = jax.tree_util.tree_map(lambda x: 40 * x, params)
    full = model.apply({"params": params}, sigma)
    if hasattr(type(model), "log_abs"):
        np.testing.assert_allclose(model.apply({"params": params}, sigma, method="log_abs"), jnp.real(full), rtol=1e-12)


@pytest.mark.parametrize("make", MODELS)
def test_complex_models_are_holomorphic(make):
    """Cauchy-Riemann: d/d(Im z) = i d/d(Re z) for every parameter."""
    model = make(jnp.complex128)
    assert model.holomorphic
    sigma = jnp.array([1, -1, -1, 1, 1, -1, 1], jnp.int8)
    params = model.init(jax.random.PRNGKey(2), sigma)["params"]
    flat, unravel = ravel_pytree(params)
    f = lambda v: model.apply({"params": unravel(v)}, sigma)  # noqa: E731
    tangent = jax.random.normal(jax.random.PRNGKey(3), flat.shape).astype(flat.dtype)
    _, d_re = jax.jvp(f, (flat,), (tangent,))
    _, d_im = jax.jvp(f, (flat,), (1j * tangent,))
    np.testing.assert_allclose(d_im, 1j * d_re, rtol=1e-10)


def test_log_cosh_is_stable_and_exact():
    x = jnp.array([-800.0, -3.0, 0.0, 2.5, 800.0])
    np.testing.assert_allclose(log_cosh(x)[1:4], np.log(np.cosh(np.array([-3.0, 0.0, 2.5]))), rtol=1e-12)
    assert np.all(np.isfinite(log_cosh(x)))
    z = jnp.array([0.3 + 0.7j, -2.0 + 0.1j])
    np.testing.assert_allclose(log_cosh(z), np.log(np.cosh(np.asarray(z))), rtol=1e-12)


@pytest.mark.parametrize("m", [7, 36, 2 * LOG_PROD_BLOCK + 3])
def test_sums_of_log_cosh_by_blocked_products(m):
    """The product forms equal the elementwise sums (imaginary part modulo 2 pi), stay finite
    for huge arguments, and differentiate to tanh."""
    k1, k2 = jax.random.split(jax.random.PRNGKey(m))
    x = 3.0 * jax.random.normal(k1, (5, m)).at[0, 0].set(900.0)
    z = x + 2j * jax.random.normal(k2, (5, m))
    exact = jnp.sum(log_cosh(z), axis=-1)
    np.testing.assert_allclose(sum_log_cosh(x), jnp.sum(log_cosh(x), axis=-1), rtol=1e-13)
    np.testing.assert_allclose(sum_log_cosh_real_part(x), jnp.sum(log_cosh(x), axis=-1), rtol=1e-13)
    np.testing.assert_allclose(sum_log_cosh_real_part(z), jnp.real(exact), rtol=1e-13)
    got = sum_log_cosh(z)
    np.testing.assert_allclose(jnp.real(got), jnp.real(exact), rtol=1e-13)
    np.testing.assert_allclose(jnp.exp(1j * (jnp.imag(got) - jnp.imag(exact))), 1.0, atol=1e-12)
    grad = jax.grad(lambda z: jnp.sum(sum_log_cosh(z)), holomorphic=True)(z)
    np.testing.assert_allclose(grad, jnp.tanh(z), rtol=1e-12)


@pytest.mark.parametrize(
    "make,key",
    [(lambda: RBM(alpha=0), "alpha"), (lambda: RBM(alpha="x"), "alpha"), (lambda: MLP(hidden=[]), "hidden"),
     (lambda: RBM(param_dtype=jnp.int32), "param_dtype")],
)
def test_bad_model_values(make, key):
    with pytest.raises(ConfigError) as info:
        make()
    assert info.value.key == key
