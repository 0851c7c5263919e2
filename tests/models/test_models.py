"""Wavefunction models: shapes, dtypes, holomorphy, numerically stable activations."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree
from jax.test_util import check_grads

from models import MLP, RBM, Jastrow
from models.common import (
    LOG_PROD_BLOCK,
    arctan2,
    log1p_unit,
    log_cosh,
    sincos,
    sum_log_cosh,
    sum_log_cosh_real_part,
)
from models.fast_paths import log_abs_method
from runner.errors import ConfigError
from tests.helpers.config import LATTICE_CONFIGS
from tests.helpers.pairwise import pairwise

try:
    import mpmath  # optional: the arctan2 reference where NumPy's long double is float64
except ImportError:
    mpmath = None

DTYPES = [jnp.float64, jnp.float32, jnp.complex128, jnp.complex64]
MODELS = {"rbm": lambda d: RBM(alpha=2, param_dtype=d),
          "rbm_no_visible_bias": lambda d: RBM(alpha=1, use_visible_bias=False, param_dtype=d),
          "jastrow": lambda d: Jastrow(param_dtype=d), "mlp": lambda d: MLP(hidden=[6, 3], param_dtype=d)}
WITH_LOG_ABS = ["rbm", "rbm_no_visible_bias", "mlp"]  # the rest: the runner takes Re of log psi


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", MODELS)
@pytest.mark.slow
def test_shapes_and_dtypes(name, dtype):
    model = MODELS[name](dtype)
    sigma = jnp.where(jax.random.bernoulli(jax.random.PRNGKey(0), 0.5, (3, 5, 7)), 1, -1).astype(jnp.int8)
    params = model.init(jax.random.PRNGKey(1), sigma[0, 0])["params"]
    assert all(x.dtype == jnp.dtype(dtype) for x in jax.tree_util.tree_leaves(params))
    out = model.apply({"params": params}, sigma)
    assert out.shape == (3, 5) and out.dtype == jnp.dtype(dtype)
    single = model.apply({"params": params}, sigma[1, 2])
    atol = 1e-6 if jnp.finfo(dtype).bits == 32 else 1e-14  # batched and single products round differently
    np.testing.assert_allclose(single, out[1, 2], rtol=1e-5, atol=atol)


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.complex128])
@pytest.mark.parametrize("name", WITH_LOG_ABS)
@pytest.mark.slow
def test_log_abs_is_the_real_part(name, dtype):
    assert [n for n in MODELS if log_abs_method(MODELS[n](dtype)) == "log_abs"] == WITH_LOG_ABS
    model = MODELS[name](dtype)
    sigma = jnp.where(jax.random.bernoulli(jax.random.PRNGKey(4), 0.5, (9, 7)), 1, -1).astype(jnp.int8)
    params = model.init(jax.random.PRNGKey(5), sigma[0])["params"]
    params = jax.tree_util.tree_map(lambda x: 40 * x, params)
    full = model.apply({"params": params}, sigma)
    assert np.ptp(np.asarray(jnp.real(full))) > 1  # parameters large enough to matter
    np.testing.assert_allclose(model.apply({"params": params}, sigma, method="log_abs"), jnp.real(full), rtol=1e-12)


@pytest.mark.parametrize("name", MODELS)
def test_complex_models_are_holomorphic(name):
    """Cauchy-Riemann: d/d(Im z) = i d/d(Re z) for every parameter."""
    model = MODELS[name](jnp.complex128)
    assert model.holomorphic
    sigma = jnp.array([1, -1, -1, 1, 1, -1, 1], jnp.int8)
    params = model.init(jax.random.PRNGKey(2), sigma)["params"]
    flat, unravel = ravel_pytree(params)
    f = lambda v: model.apply({"params": unravel(v)}, sigma)  # noqa: E731
    tangent = jax.random.normal(jax.random.PRNGKey(3), flat.shape).astype(flat.dtype)
    _, d_re = jax.jvp(f, (flat,), (tangent,))
    _, d_im = jax.jvp(f, (flat,), (1j * tangent,))
    np.testing.assert_allclose(d_im, 1j * d_re, rtol=1e-10)


def _pair_matrix(w_P, n):
    """The symmetric n x n matrix with zero diagonal holding pair (i, j)'s coupling, pairs i < j in
    row-major order (the Jastrow's parameter layout), at [i, j] and [j, i]."""
    w_NxN = np.zeros((n, n), np.asarray(w_P).dtype)
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    for k, (i, j) in enumerate(pairs):
        w_NxN[i, j] = w_NxN[j, i] = w_P[k]
    return w_NxN


def _random_couplings(n, dtype, seed=0):
    rng = np.random.default_rng(seed)
    w_P = rng.normal(size=n * (n - 1) // 2)
    if jnp.iscomplexobj(jnp.zeros((), dtype)):
        w_P = w_P + 1j * rng.normal(size=w_P.shape)
    return jnp.asarray(w_P, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_jastrow_is_its_pair_sum_on_every_configuration(dtype):
    """log psi(s) = sum_{i<j} s_i W_ij s_j = s.W.s / 2 on all 2^7 configurations, from one free
    coupling per pair (n (n - 1) / 2 of them, starting small)."""
    n = 7
    sigma_KxN = np.array(list(itertools.product([1, -1], repeat=n)), np.int8)
    model = Jastrow(param_dtype=dtype)
    init = model.init(jax.random.PRNGKey(0), jnp.asarray(sigma_KxN[0]))["params"]
    assert list(init) == ["pair_coupling"] and init["pair_coupling"].shape == (n * (n - 1) // 2,)
    assert 0 < np.std(np.abs(np.asarray(init["pair_coupling"]))) < 0.05
    w_P = _random_couplings(n, dtype)
    log_psi_K = jax.jit(lambda s: model.apply({"params": {"pair_coupling": w_P}}, s))(jnp.asarray(sigma_KxN))
    assert log_psi_K.shape == (2 ** n,) and log_psi_K.dtype == jnp.dtype(dtype)
    s_KxN = sigma_KxN.astype(np.complex128)
    expected_K = np.einsum("ki,ij,kj->k", s_KxN, _pair_matrix(np.asarray(w_P, np.complex128), n), s_KxN) / 2
    tol = 1e-5 if jnp.finfo(dtype).bits == 32 else 1e-13
    np.testing.assert_allclose(np.asarray(log_psi_K, np.complex128), expected_K, rtol=tol, atol=tol)
    assert np.ptp(expected_K.real) > 5  # couplings of order 1: far from constant


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.complex128])
def test_jastrow_symmetries(dtype):
    """A global spin flip leaves log psi unchanged (bit for bit), and relabelling the sites is
    relabelling the couplings: log psi_W(s o p) = log psi_W'(s) with W' = W[p^-1][:, p^-1]."""
    n = 6
    sigma_KxN = jnp.asarray(list(itertools.product([1, -1], repeat=n)), jnp.int8)
    model = Jastrow(param_dtype=dtype)
    w_P = _random_couplings(n, dtype, seed=1)
    apply = jax.jit(lambda w, s: model.apply({"params": {"pair_coupling": w}}, s))
    log_psi_K = apply(w_P, sigma_KxN)
    np.testing.assert_array_equal(apply(w_P, -sigma_KxN), log_psi_K)
    perm = np.random.default_rng(2).permutation(n)
    inv = np.argsort(perm)
    relabelled = _pair_matrix(np.asarray(w_P), n)[inv][:, inv][np.triu_indices(n, k=1)]
    np.testing.assert_allclose(apply(w_P, sigma_KxN[:, perm]), apply(jnp.asarray(relabelled), sigma_KxN),
                               rtol=1e-13, atol=1e-13)
    assert not np.allclose(apply(w_P, sigma_KxN[:, perm]), log_psi_K)  # the relabelling matters


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.complex128])
def test_jastrow_log_derivatives_are_the_pair_products(dtype):
    """d log psi / d W_ij = s_i s_j on every configuration (the rows O_k that SR uses, holomorphic
    for complex couplings), and JAX's derivatives agree with finite differences."""
    n = 5
    sigma_KxN = jnp.asarray(list(itertools.product([1, -1], repeat=n)), jnp.int8)
    model = Jastrow(param_dtype=dtype)
    w_P = _random_couplings(n, dtype, seed=3)

    def log_psi(w, s):
        return model.apply({"params": {"pair_coupling": w}}, s)

    holomorphic = jnp.iscomplexobj(w_P)
    o_KxP = jax.jit(jax.vmap(jax.grad(log_psi, holomorphic=holomorphic), in_axes=(None, 0)))(w_P, sigma_KxN)
    i, j = np.triu_indices(n, k=1)
    s_KxN = np.asarray(sigma_KxN, np.float64)
    np.testing.assert_array_equal(o_KxP, (s_KxN[:, i] * s_KxN[:, j]).astype(dtype))
    check_grads(lambda w: log_psi(w, sigma_KxN), (w_P,), order=2, modes=("fwd", "rev"), atol=1e-7, rtol=1e-7)


def test_log_cosh_is_stable_and_exact():
    x = jnp.array([-800.0, -3.0, 0.0, 2.5, 800.0])
    np.testing.assert_allclose(log_cosh(x)[1:4], np.log(np.cosh(np.array([-3.0, 0.0, 2.5]))), rtol=1e-12)
    assert np.all(np.isfinite(log_cosh(x)))
    z = jnp.array([0.3 + 0.7j, -2.0 + 0.1j])
    np.testing.assert_allclose(log_cosh(z), np.log(np.cosh(np.asarray(z))), rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_real_log_cosh_without_log1p_against_extended_precision(dtype):
    """log1p_unit on [0, 1] and the real log cosh built on it, values and derivatives, against
    NumPy's long double (80-bit on x86: exact enough to judge the last bit of a double)."""
    eps = np.finfo(dtype).eps
    e = np.linspace(0.0, 1.0, 20001).astype(dtype)
    exact = np.log1p(e.astype(np.longdouble))
    assert np.max(np.abs(np.asarray(log1p_unit(jnp.asarray(e))) - exact)) <= 2 * eps * np.log(2.0)
    x = (np.random.default_rng(0).normal(size=20000) * np.array([1e-3, 1.0, 10.0]).repeat(6667)[:20000]).astype(dtype)
    x = np.concatenate([x, np.array([0.0, 18.0, -19.0, 40.0, 710.0, -800.0], dtype)])
    a = np.abs(x.astype(np.longdouble))
    exact = a + np.log1p(np.exp(-2 * a)) - np.log(np.longdouble(2))
    got = np.asarray(log_cosh(jnp.asarray(x)))
    assert got.dtype == dtype
    # within a few ulp of the larger of |x| and log 2 (the terms the sum is made of)
    assert np.all(np.abs(got - exact) <= 4 * eps * np.maximum(a, np.log(2.0)))
    slope = np.asarray(jax.vmap(jax.grad(log_cosh))(jnp.asarray(x)))
    assert np.all(np.abs(slope - np.tanh(x.astype(np.longdouble))) <= 8 * eps)


@pytest.mark.parametrize("m", [7, 36, 2 * LOG_PROD_BLOCK + 3])
@pytest.mark.slow
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


@pytest.mark.parametrize("dtype,ulp", [(np.float32, 1.2e-7), (np.float64, 2.3e-16)])
def test_sincos_against_numpy(dtype, ulp):
    """One range reduction for both: within about an ulp of NumPy's sin and cos from 0 to
    1e5 (both signs), the quadrant boundaries k pi/2 included; its derivative is cos, -sin."""
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.normal(size=4000) * scale for scale in (1, 30, 1e3, 1e5)]
                       + [np.arange(-40, 41) * np.pi / 4]).astype(dtype)
    s, c = sincos(jnp.asarray(x))
    assert s.dtype == c.dtype == dtype
    wide = x.astype(np.float64)
    np.testing.assert_allclose(s, np.sin(wide), rtol=0, atol=2 * ulp)
    np.testing.assert_allclose(c, np.cos(wide), rtol=0, atol=2 * ulp)
    ds = jax.vmap(jax.grad(lambda t: sincos(t)[0]))(jnp.asarray(x[:200]))
    np.testing.assert_allclose(ds, np.cos(wide[:200]), rtol=0, atol=8 * ulp)


def _arctan2_reference(y, x, dtype):
    """(arctan2(y, x) rounded to dtype, slack): correctly rounded (slack 0) from NumPy's long double
    where it is wider than float64 (x86's 80 bits, or quad) or from mpmath, else NumPy's float64
    arctan2 with the slack of its implementations (glibc; SVML under AVX-512: up to 4 ulp)."""
    if np.finfo(np.longdouble).nmant > np.finfo(np.float64).nmant:
        return np.arctan2(y.astype(np.longdouble), x.astype(np.longdouble)).astype(dtype), 0
    if mpmath is None:
        return np.arctan2(y.astype(np.float64), x.astype(np.float64)).astype(dtype), 4 if dtype == np.float64 else 1
    with mpmath.workprec(113):
        exact = [float(mpmath.atan2(mpmath.mpf(float(a)), mpmath.mpf(float(b)))) for a, b in zip(y, x)]
    return np.array(exact).astype(dtype), 0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_arctan2_against_extended_precision(dtype):
    """Within 2 ulp of the correctly rounded arctan2 over all four quadrants and magnitudes from
    1e-15 to 1e15 (the reductions' boundaries |y| = |x| and |y| = tan(pi/8) |x| included), the
    axes and infinities exactly, NaN kept; its derivative (JAX's, through the polynomial) is
    (x dy - y dx) / (x^2 + y^2) to 32 epsilon."""
    rng = np.random.default_rng(5)
    y = np.concatenate([rng.normal(size=20000) * 10.0 ** rng.integers(-15, 16, size=20000),
                        np.tan(np.pi / 8) * np.arange(1, 50), np.arange(-40, 41)]).astype(dtype)
    x = np.concatenate([rng.normal(size=20000) * 10.0 ** rng.integers(-15, 16, size=20000),
                        np.arange(1, 50), np.arange(-40, 41)[::-1]]).astype(dtype)
    got = np.asarray(arctan2(jnp.asarray(y), jnp.asarray(x)))
    assert got.dtype == dtype
    reference, slack = _arctan2_reference(y, x, dtype)
    ulps = np.abs(got.astype(np.float64) - reference) / np.spacing(np.abs(reference))
    assert np.max(ulps) <= 2 + slack, np.max(ulps)
    special_y = np.array([0, 0, 1, -1, np.inf, -np.inf, 1, -1, np.nan], dtype)
    special_x = np.array([1, -1, 0, 0, 1, 1, np.inf, -np.inf, 1], dtype)
    np.testing.assert_array_equal(arctan2(jnp.asarray(special_y), jnp.asarray(special_x)),
                                  np.arctan2(special_y, special_x))
    wide_y, wide_x = rng.normal(size=(2, 200))
    dy, dx = jax.vmap(jax.grad(arctan2, argnums=(0, 1)))(jnp.asarray(wide_y, dtype), jnp.asarray(wide_x, dtype))
    wide_y, wide_x = (v.astype(dtype).astype(np.float64) for v in (wide_y, wide_x))
    np.testing.assert_allclose(dy, wide_x / (wide_x ** 2 + wide_y ** 2), rtol=32 * np.finfo(dtype).eps)
    np.testing.assert_allclose(dx, -wide_y / (wide_x ** 2 + wide_y ** 2), rtol=32 * np.finfo(dtype).eps)


@pytest.mark.parametrize("dtype", [jnp.complex64, jnp.complex128])
def test_complex_log_cosh_near_its_poles(dtype):
    """Near a pole of log cosh (x = i pi/2 + k i pi) |cosh x|^2 is tiny, and 1 + 2 Re w + |w|^2
    rounded below zero there in complex64 (NaN log psi in a 6 x 6 CNN run); as a sum of squares
    it is a finite number, and elsewhere the same as complex128's to complex64's precision."""
    rng = np.random.default_rng(4)
    pole = 1j * np.pi * (0.5 + rng.integers(-3, 4, size=20000))
    x = pole + (rng.normal(size=20000) + 1j * rng.normal(size=20000)) * np.logspace(-7, -1, 20000)
    got = np.asarray(log_cosh(jnp.asarray(x, dtype)))
    assert np.all(np.isfinite(got))
    exact = np.log(np.cosh(np.asarray(jnp.asarray(x, dtype), np.complex128)))
    far = np.abs(x - pole) > 1e-2
    tol = 1e-5 if dtype == jnp.complex64 else 1e-12
    np.testing.assert_allclose(got.real[far], exact.real[far], atol=tol)
    np.testing.assert_allclose(np.exp(1j * (got.imag[far] - exact.imag[far])), 1.0, atol=tol)
    f = sum_log_cosh_real_part(jnp.asarray(x, dtype)[:, None])
    assert not np.any(np.isnan(f))


@pytest.mark.parametrize(
    "make,key",
    [(lambda: RBM(alpha=0), "alpha"), (lambda: RBM(alpha="x"), "alpha"), (lambda: MLP(hidden=[]), "hidden"),
     (lambda: RBM(param_dtype=jnp.int32), "param_dtype")],
)
def test_bad_model_values(make, key):
    with pytest.raises(ConfigError) as info:
        make()
    assert info.value.key == key


# --- the lattice models (rbm_symm, cnn, vit) and their symmetry projection, against exact sums ----

from models import CNN, GCNN, RBMSymm, ViT  # noqa: E402
from runner.core import local_energy, precond_types  # noqa: E402
from runner.core.wavefunction import gradient_mode  # noqa: E402
from runner.physics import hamiltonians
from runner.physics import hilbert as hb  # noqa: E402
from tests.helpers.dense import basis_index, dense_heisenberg, dense_psi  # noqa: E402
from tests.helpers.exact import exact_energy, exact_weighted, problem_of, wirtinger_reference  # noqa: E402

LATTICE_MODELS = {
    "rbm_symm_chain": (lambda: hb.chain(6), lambda h, d: RBMSymm(alpha=2, param_dtype=d, hilbert=h)),
    "rbm_symm_square_parity": (lambda: hb.square(3), lambda h, d: RBMSymm(
        alpha=1, sector={"momentum": [0, 0], "irrep": "A1", "parity": 1}, param_dtype=d, hilbert=h)),
    "cnn_chain": (lambda: hb.chain(6), lambda h, d: CNN(channels=3, depth=2, param_dtype=d, hilbert=h)),
    "cnn_square": (lambda: hb.square(3), lambda h, d: CNN(channels=2, depth=2, param_dtype=d, hilbert=h)),
    "cnn_triangular": (lambda: hb.triangular(3), lambda h, d: CNN(channels=2, depth=2, param_dtype=d, hilbert=h)),
    "cnn_kagome_jastrow": (lambda: hb.kagome(Lx=2, Ly=1), lambda h, d: CNN(
        channels=2, depth=2, jastrow=True, param_dtype=d, hilbert=h)),
    "cnn_square_projected_parity": (lambda: hb.square(3), lambda h, d: CNN(
        channels=2, depth=1, sector={"momentum": [0, 0], "irrep": "A1", "parity": -1}, param_dtype=d, hilbert=h)),
    "cnn_square_B1": (lambda: hb.square(3), lambda h, d: CNN(
        channels=2, depth=1, sector={"momentum": [0, 0], "irrep": "B1", "parity": 1}, param_dtype=d, hilbert=h)),
    "vit_chain_projected_momentum": (lambda: hb.chain(6), lambda h, d: ViT(
        patch_size=6, d_model=4, n_heads=1, sector={"momentum": [1], "irrep": "A", "parity": 1}, param_dtype=d,
        hilbert=h)),
    "vit_square": (lambda: hb.square(2), lambda h, d: ViT(patch_size=1, d_model=4, n_heads=2, param_dtype=d, hilbert=h)),
    "vit_chain_projected": (lambda: hb.chain(6), lambda h, d: ViT(
        patch_size=2, d_model=4, n_heads=2, sector={"momentum": [0], "irrep": "A'"}, param_dtype=d, hilbert=h)),
    "gcnn_triangular": (lambda: hb.triangular(3), lambda h, d: GCNN(features=[2, 2], param_dtype=d, hilbert=h)),
    "gcnn_chain_momentum_parity": (lambda: hb.chain(6), lambda h, d: GCNN(
        features=[3, 2], sector={"momentum": [1], "irrep": "A", "parity": -1}, param_dtype=d, hilbert=h)),
}
# Models whose log psi is invariant under every lattice translation (a ViT only under whole
# patches unless projected; the momentum model picks up a phase, checked separately; B1 vanishes
# on many configurations, the transformations of the sectors are in test_symmetrize).
INVARIANT = ["rbm_symm_chain", "rbm_symm_square_parity", "cnn_chain", "cnn_square", "cnn_triangular",
             "cnn_kagome_jastrow", "cnn_square_projected_parity", "vit_square", "vit_chain_projected",
             "gcnn_triangular"]


def _lattice_model(name, dtype, seed=0):
    make_lattice, make_model = LATTICE_MODELS[name]
    lattice = make_lattice()
    model = make_model(lattice, dtype)
    states = jnp.asarray(hb.all_states(lattice))
    params = model.init(jax.random.PRNGKey(seed), states[0])["params"]
    if name.startswith("rbm_symm"):  # away from its near-uniform start (the deep models start there already)
        params = jax.tree_util.tree_map(lambda x: 10 * x, params)
    if name.startswith("gcnn"):  # at its start's scale a 6-site sector's psi spans more than alive's 1e-6 cut
        params = jax.tree_util.tree_map(lambda x: 0.3 * x, params)
    return lattice, model, states, params


def _same_amplitude(a, b, rtol=1e-11):
    """log psi equal up to rounding, imaginary parts modulo 2 pi."""
    a, b = np.asarray(a), np.asarray(b)
    np.testing.assert_allclose(a.real, b.real, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(np.exp(1j * (a.imag - b.imag)), 1.0, atol=rtol * 10)


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.complex128])
@pytest.mark.parametrize("name", INVARIANT)
@pytest.mark.slow
def test_log_psi_is_invariant_under_translations(name, dtype):
    lattice, model, states, params = _lattice_model(name, dtype)
    assert len(lattice.translations) > 1
    apply = jax.jit(lambda s: model.apply({"params": params}, s))
    log_psi = apply(states)
    assert not np.allclose(np.asarray(log_psi), np.asarray(log_psi)[0])  # not a constant
    for perm in lattice.translations[1:]:
        _same_amplitude(apply(states[:, perm]), log_psi)


@pytest.mark.parametrize("n_layers", [1, 2, 4, 8])
@pytest.mark.slow
def test_vit_starts_nearly_flat_at_any_depth(n_layers):
    """At its initial parameters the ViT's log|psi| varies little over random configurations,
    whatever its depth (the residual branches start at 1 / sqrt(2 n_layers)); at unit gain the
    spread was 12 with 4 layers and 261 with 8, and the Markov chains froze."""
    lattice = hb.square(6, total_sz=0)
    spins = np.tile(np.repeat(np.array([1, -1], np.int8), 18), (256, 1))
    sigma = jnp.asarray(np.random.default_rng(0).permuted(spins, axis=1))
    model = ViT(patch_size=2, d_model=64, n_heads=4, n_layers=n_layers, hilbert=lattice, param_dtype=jnp.float64)
    params = model.init(jax.random.PRNGKey(0), sigma[:1])["params"]
    assert np.std(np.real(np.asarray(model.apply({"params": params}, sigma)))) < 0.5


@pytest.mark.slow
def test_vit_without_projection_is_invariant_only_under_whole_patches():
    lattice = hb.chain(6)
    model = ViT(patch_size=2, d_model=4, n_heads=1, hilbert=lattice)
    states = jnp.asarray(hb.all_states(lattice))
    params = jax.tree_util.tree_map(lambda x: 3 * x, model.init(jax.random.PRNGKey(0), states[0])["params"])
    log_psi = model.apply({"params": params}, states)
    _same_amplitude(model.apply({"params": params}, states[:, lattice.translations[2]]), log_psi)
    shifted = model.apply({"params": params}, states[:, lattice.translations[1]])
    assert np.max(np.abs(np.asarray(shifted - log_psi).real)) > 1e-3


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.complex128])
@pytest.mark.slow
def test_momentum_sector_phase(dtype):
    """psi_P(T_u s) = exp(i q . d_u) psi_P(s) with q = 2 pi m / L."""
    lattice, model, states, params = _lattice_model("vit_chain_projected_momentum", dtype)
    apply = jax.jit(lambda s: model.apply({"params": params}, s))
    log_psi = apply(states)
    assert np.iscomplexobj(np.asarray(log_psi))
    # Configurations whose orbit is shorter than L have psi = 0 in this sector (rounding noise here).
    alive = np.asarray(log_psi.real) > np.max(np.asarray(log_psi.real)) - 15
    assert 0.5 < np.mean(alive) < 1
    for u, perm in enumerate(lattice.translations):
        d_u = lattice.translations[u][0]  # the image of site 0
        _same_amplitude(apply(states[:, perm])[alive], (log_psi + 2j * np.pi * d_u / 6)[alive])


def _dense_heisenberg(lattice, J2):
    return dense_heisenberg(lattice.bonds, lattice.next_bonds, lattice.n_sites, 1.0, J2)


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.complex128])
@pytest.mark.parametrize("name", sorted(LATTICE_MODELS))
@pytest.mark.slow
def test_local_energies_match_dense_h_psi(name, dtype):
    lattice, model, states, params = _lattice_model(name, dtype)
    J2 = 0.3 if lattice.shape == (6,) else 0.0
    ham = hamiltonians.heisenberg(lattice, J=1.0, J2=J2, phase_prior="none")
    logpsi = lambda p, s: model.apply({"params": p}, s)  # noqa: E731
    eloc = jax.jit(jax.vmap(lambda s: local_energy.local_energy(ham, logpsi, params, s)))(states)
    psi = dense_psi(model.apply({"params": params}, states), np.asarray(states))
    idx = basis_index(np.asarray(states))
    expected = (_dense_heisenberg(lattice, J2) @ psi)[idx] / psi[idx]
    alive = np.abs(psi[idx]) > 1e-6 * np.max(np.abs(psi))  # psi = 0 in a momentum sector: no local energy
    assert np.mean(alive) > 0.5
    np.testing.assert_allclose(np.asarray(eloc)[alive], expected[alive], rtol=1e-9, atol=1e-9)


def test_the_cnn_jastrow_factor_is_a_coupling_per_basis_site_and_displacement():
    """log psi with the factor minus log psi without it is 1/2 sum_{i != j} s_i J_ij s_j, J_ij the
    kernel's entry at (j moved by the translation taking i's cell to cell 0, basis site of i): on
    the kagome 2 x 2 torus, every pair written out by hand."""
    lattice = hb.kagome(Lx=2, Ly=2)
    model = CNN(channels=2, depth=2, jastrow=True, param_dtype=jnp.complex128, hilbert=lattice)
    sigma = jnp.asarray(np.random.default_rng(0).choice([-1, 1], (5, lattice.n_sites)), jnp.int8)
    params = model.init(jax.random.PRNGKey(3), sigma[:1])["params"]
    without = {**params, "jastrow": jnp.zeros_like(params["jastrow"])}
    got = model.apply({"params": params}, sigma) - model.apply({"params": without}, sigma)
    shape, n_basis = (2, 2), 3
    kernel = np.asarray(params["jastrow"])
    expected = np.zeros(len(sigma), complex)
    for i in range(lattice.n_sites):
        ci, bi = np.unravel_index(i // n_basis, shape), i % n_basis
        for j in range(lattice.n_sites):
            if i != j:
                cj, bj = np.unravel_index(j // n_basis, shape), j % n_basis
                moved = np.ravel_multi_index(tuple((np.array(cj) - np.array(ci)) % shape), shape) * n_basis + bj
                expected += 0.5 * kernel[moved, bi] * np.asarray(sigma[:, i] * sigma[:, j])
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.complex128])
@pytest.mark.parametrize("name", ["rbm_symm_chain", "cnn_chain", "cnn_triangular", "cnn_kagome_jastrow",
                                  "vit_chain_projected_momentum", "vit_square", "vit_chain_projected",
                                  *(pytest.param(n, marks=pytest.mark.slow)  # 40 to 60 s each on 2 busy cores
                                    for n in ("gcnn_triangular", "gcnn_chain_momentum_parity"))])
@pytest.mark.slow
def test_force_matches_exact_gradient(name, dtype):
    """The core's log-derivatives give the force 2 <O* (E_loc - E)> of the exact distribution,
    equal to the derivative of the exact energy <psi|H|psi> / <psi|psi> (Kronecker H)."""
    lattice, model, states, params = _lattice_model(name, dtype, seed=1)
    J2 = 0.3 if lattice.shape == (6,) else 0.0
    ham = hamiltonians.heisenberg(lattice, J=1.0, J2=J2, phase_prior="none")
    problem = problem_of(model, ham)
    mode = gradient_mode(params, model)
    assert mode == ("holomorphic" if dtype == jnp.complex128 else "real")
    Obar, eps, E = exact_weighted(problem, params, states, mode)
    H = jnp.asarray(_dense_heisenberg(lattice, J2)[np.ix_(*(2 * [basis_index(np.asarray(states))]))])
    np.testing.assert_allclose(E, exact_energy(model, states, H)(params), rtol=1e-10)
    F = precond_types.force(precond_types.from_dense(Obar.T, mode), eps, mode)
    expected = wirtinger_reference(exact_energy(model, states, H), params)
    np.testing.assert_allclose(np.asarray(F), np.asarray(expected), rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize(
    "make,key",
    [(lambda h: RBMSymm(alpha=1.5, hilbert=h), "alpha"), (lambda h: CNN(depth=0, hilbert=h), "depth"),
     (lambda h: CNN(sector="rotations", hilbert=h), "sector"),
     (lambda h: CNN(sector={"momentum": [0], "irrep": "A'", "parity": 2}, hilbert=h), "sector.parity"),
     (lambda h: RBMSymm(group="rotations", hilbert=h), "group"),
     (lambda h: ViT(patch_size=1, sector={"momentum": [1], "irrep": "A"}, hilbert=h), "sector"),
     (lambda h: ViT(patch_size=1, sector={"momentum": [1, 0], "irrep": "A"}, hilbert=h), "sector.momentum"),
     (lambda h: ViT(patch_size=4, hilbert=h), "patch_size"), (lambda h: ViT(d_model=6, n_heads=4, hilbert=h), "n_heads"),
     (lambda h: RBMSymm(), "hilbert")],
)
def test_bad_lattice_model_values(make, key):
    with pytest.raises(ConfigError) as info:
        make(hb.chain(6))
    assert info.value.key == key


# --- the lattice models in the VMC core: one step on every layout (their short runs to the exact
# energy: tests/integration/test_convergence.py) -----------------------------------------------



@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float64", "complex128"])
@pytest.mark.parametrize("name", sorted(LATTICE_CONFIGS))
def test_one_step_is_the_same_on_one_and_four_devices(name, dtype):
    from runner.config.build import build
    from tests.helpers.config import compose_config
    from tests.helpers.parallel import one_step_on_one_and_four_devices

    # The vit at d_model 4 (under 500 parameters: the dense SR solve). At its default size SR takes
    # CG, whose first product is intermittently NaN for real parameters with complex log psi
    # (on one device or four alike; the dense solve of the same step is finite): reported.
    small = ["model.d_model=4", "model.n_heads=1"] if name == "vit" else []
    config = compose_config(["hilbert=square", "hilbert.L=4", "hamiltonian=heisenberg", "sampler.n_samples=64",
                             "sampler.n_chains=8", f"dtype={dtype}", "exact=false", *LATTICE_CONFIGS[name], *small,
                             "model.sector={momentum:[0,0],irrep:A1}"])
    (stats_1, grads_1), (stats_4, grads_4) = one_step_on_one_and_four_devices(build(config).problem,
                                                                              jnp.ones((16,), jnp.int8))
    np.testing.assert_allclose(stats_4.mean, stats_1.mean, rtol=1e-12)
    for a, b in zip(jax.tree_util.tree_leaves(grads_4), jax.tree_util.tree_leaves(grads_1)):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("shape,kernel_size,pbc", [((6,), 3, True), ((5,), 4, False), ((3, 3), 3, True),
                                                   ((4, 3), 2, False)])
@pytest.mark.parametrize("dtype", [jnp.float64, jnp.complex64])
@pytest.mark.slow
def test_a_constant_channel_carries_the_bias(shape, kernel_size, pbc, dtype):
    """The CNN's first layer adds its bias inside the convolution, through an input channel of
    ones (`with_bias_channel`): the same as adding it after, with or without periodic padding
    (the bias sits at the kernel's centre, which never reaches the padding)."""
    from models.cnn import grid_conv, with_bias_channel

    rng = np.random.default_rng(1)
    c_in, c_out, n_window = 2, 3, kernel_size ** len(shape)
    parts = 2 if jnp.iscomplexobj(jnp.zeros((), dtype)) else 1
    h = jnp.asarray(rng.normal(size=(4, *shape, c_in)), dtype)
    kernel, bias = (jnp.asarray(sum(1j ** i * rng.normal(size=size) for i in range(parts)), dtype)
                    for size in ((n_window * c_in, c_out), (c_out,)))
    conv = grid_conv(shape, kernel_size, pbc)
    got = conv(jnp.concatenate([h, jnp.ones_like(h[..., :1])], axis=-1),
               with_bias_channel(kernel, bias, kernel_size, len(shape)))
    tol = 1e-12 if jnp.finfo(dtype).bits == 64 else 2e-5
    np.testing.assert_allclose(got, conv(h, kernel) + bias, rtol=tol, atol=tol)


GRIDS = [((6,), 3, True), ((5,), 4, False), ((3, 3), 3, True), ((2, 4), 5, True), ((4, 3), 2, False)]


# Each formulation's code depends on the grid (padding, wrapping) and on the dtype (complex64's stacked
# real parts), not on both at once: every (grid, form), (dtype, form) and (grid, dtype) pair, 15 cases.
@pytest.mark.parametrize("grid,dtype,form", pairwise(GRIDS, [jnp.float64, jnp.complex128, jnp.complex64],
                                                     ["xla", "windows", "dense"]))
@pytest.mark.slow
def test_grid_conv_is_the_sum_over_the_neighbour_table(grid, dtype, form):
    """Each of the convolution's formulations (XLA's convolution of the padded grid, the stacked
    windows' product, the whole layer's matrix) equals the explicit sum over every cell's kernel
    window (`neighbour_table`, zeros outside open boundaries, wrapped more than once where the
    kernel is wider than the lattice), and its hand-made derivative (window products for the
    kernel) equals finite differences, forward and reverse, also batched over samples. complex64
    (one real convolution of stacked real and imaginary parts) to its precision, its derivatives
    against complex128's."""
    from jax.test_util import check_grads

    from models.cnn import grid_conv, neighbour_table

    shape, kernel_size, pbc = grid
    rng = np.random.default_rng(0)
    c_in, c_out, n_window = 2, 3, kernel_size ** len(shape)
    h = rng.normal(size=(4, *shape, c_in))
    kernel = rng.normal(size=(n_window * c_in, c_out))
    if jnp.iscomplexobj(jnp.zeros((), dtype)):
        h, kernel = h + 1j * rng.normal(size=h.shape), kernel + 1j * rng.normal(size=kernel.shape)
    h, kernel = jnp.asarray(h, dtype), jnp.asarray(kernel, dtype)
    conv = jax.jit(grid_conv(shape, kernel_size, pbc, form))  # compiled once, not op by op
    tol = 1e-12 if jnp.finfo(dtype).bits == 64 else 2e-5

    table = neighbour_table(shape, kernel_size, pbc)
    cells = np.concatenate([np.asarray(h, np.complex128).reshape(4, -1, c_in), np.zeros((4, 1, c_in))], axis=1)
    expected = (cells[:, table, :].reshape(4, table.shape[0], -1) @ np.asarray(kernel, np.complex128)).reshape(
        4, *shape, c_out)
    assert conv(h, kernel).dtype == dtype
    np.testing.assert_allclose(conv(h, kernel), expected, rtol=tol, atol=tol)

    @jax.jit
    def per_sample_grad(conv_kernel, x):
        return jax.vmap(jax.grad(lambda k, x: jnp.sum(jnp.real(conv(x, k)) * jnp.arange(c_out))),
                        in_axes=(None, 0))(conv_kernel, x)

    if dtype == jnp.complex64:
        wide = (h.astype(jnp.complex128), kernel.astype(jnp.complex128))
        tangents = (jnp.ones_like(h), 1j * jnp.ones_like(kernel))
        np.testing.assert_allclose(jax.jvp(conv, (h, kernel), tangents)[1],
                                   jax.jvp(conv, wide, tuple(t.astype(jnp.complex128) for t in tangents))[1],
                                   rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(per_sample_grad(kernel, h), per_sample_grad(wide[1], wide[0]), rtol=1e-4, atol=1e-4)
        return
    check_grads(conv, (h, kernel), order=1, modes=("fwd", "rev"), atol=1e-6, rtol=1e-6)
    batched = per_sample_grad(kernel, h)
    for i in range(4):
        np.testing.assert_allclose(batched[i], jax.grad(
            lambda k: jnp.sum(jnp.real(conv(h[i:i + 1], k)) * jnp.arange(c_out)))(kernel), rtol=1e-12)


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
@pytest.mark.slow
def test_the_cnn_convolves_by_the_form_its_batch_takes(dtype):
    """`models.cnn.conv_form`: with real parameters, up to WINDOW_BATCH configurations per call
    the stacked windows' product, more as one product with the layer's matrix on lattices of at
    most DENSE_CELLS_PER_WINDOW cells per kernel window, XLA's convolution beyond (and always with
    complex parameters); the CNN's log psi is the same through each (rounding) and the traced
    model holds no convolution."""
    from unittest import mock

    from models import cnn
    from runner.core.wavefunction import _has_primitive
    from runner.physics import hilbert as hb

    cells, n_window = 16, 9
    assert cnn.conv_form(cnn.WINDOW_BATCH, cells, n_window) == "windows"
    assert cnn.conv_form(cnn.WINDOW_BATCH + 1, cells, n_window) == "dense"
    assert cnn.conv_form(cnn.WINDOW_BATCH + 1, cnn.DENSE_CELLS_PER_WINDOW * n_window, n_window) == "dense"
    assert cnn.conv_form(cnn.WINDOW_BATCH + 1, cnn.DENSE_CELLS_PER_WINDOW * n_window + 1, n_window) == "xla"
    assert cnn.conv_form(1, cells, n_window, complex_params=True) == "xla"

    lattice = hb.square(4, total_sz=None)
    model = cnn.CNN(channels=3, depth=2, param_dtype=dtype, hilbert=lattice)
    sigma = jnp.asarray(hb.all_states(lattice))[::301][:cnn.WINDOW_BATCH + 8]
    assert len(sigma) == cnn.WINDOW_BATCH + 8
    params = model.init(jax.random.PRNGKey(0), sigma[:1])["params"]
    logpsi = jax.jit(lambda s: model.apply({"params": params}, s))
    with mock.patch.object(cnn, "conv_form", lambda *shape: "xla"):
        reference = jax.jit(lambda s: model.apply({"params": params}, s))(sigma)
    tol = 1e-12 if dtype == jnp.float64 else 2e-5
    for batch in (sigma[:cnn.WINDOW_BATCH], sigma):
        np.testing.assert_allclose(logpsi(batch), reference[:len(batch)], rtol=tol, atol=tol)
        jaxpr = jax.make_jaxpr(lambda s: model.apply({"params": params}, s))(batch).jaxpr
        assert not _has_primitive(jaxpr, "conv_general_dilated")
        assert _has_primitive(jaxpr, "concatenate") and _has_primitive(jaxpr, "dot_general")
