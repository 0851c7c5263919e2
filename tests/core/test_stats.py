"""Monte Carlo statistics on processes with known answers."""

import jax.numpy as jnp
import numpy as np

from runner.core.stats import statistics


def _ar1(rho, C, T, seed=0):
    rng = np.random.default_rng(seed)
    x = np.zeros((C, T))
    x[:, 0] = rng.standard_normal(C) / np.sqrt(1 - rho**2)
    for t in range(1, T):
        x[:, t] = rho * x[:, t - 1] + rng.standard_normal(C)
    return x


def test_independent_samples():
    x = np.random.default_rng(0).standard_normal((64, 512)) * 2.0 + 3.0
    s = statistics(jnp.asarray(x))
    assert abs(float(s.mean) - 3.0) < 4 * 2.0 / np.sqrt(x.size)
    assert abs(float(s.variance) - 4.0) < 0.1
    assert float(s.tau_corr) < 0.2
    np.testing.assert_allclose(float(s.error_of_mean), 2.0 / np.sqrt(x.size), rtol=0.15)
    assert abs(float(s.r_hat) - 1.0) < 0.02


def test_autocorrelated_samples():
    rho = 0.8  # integrated tau = rho / (1 - rho) = 4
    x = _ar1(rho, 64, 2048)
    s = statistics(jnp.asarray(x))
    np.testing.assert_allclose(float(s.tau_corr), 4.0, rtol=0.2)
    true_error = np.sqrt(1 / (1 - rho**2) / x.size * (1 + rho) / (1 - rho))
    np.testing.assert_allclose(float(s.error_of_mean), true_error, rtol=0.2)


def test_error_matches_spread_of_means():
    """The reported error is the actual scatter of the mean over repeated experiments."""
    means, errors = [], []
    for seed in range(40):
        s = statistics(jnp.asarray(_ar1(0.5, 16, 128, seed)))
        means.append(float(s.mean))
        errors.append(float(s.error_of_mean))
    np.testing.assert_allclose(np.std(means), np.mean(errors), rtol=0.3)


def test_many_short_chains_keep_their_autocorrelation():
    """128 chains of 32 samples (a final estimate's shape): tau and the error bar from the scatter
    of the mean over repeated experiments, not shrunk by each chain's own mean."""
    rho = 0.5  # tau = 1
    stats = [statistics(jnp.asarray(_ar1(rho, 128, 32, seed))) for seed in range(40)]
    taus = [float(s.tau_corr) for s in stats]
    assert 0.8 < np.mean(taus) < 1.2
    means, errors = [float(s.mean) for s in stats], [float(s.error_of_mean) for s in stats]
    np.testing.assert_allclose(np.std(means), np.mean(errors), rtol=0.3)


def test_r_hat_detects_unmixed_chains():
    x = np.random.default_rng(1).standard_normal((8, 256))
    x[:4] += 3.0
    assert float(statistics(jnp.asarray(x)).r_hat) > 1.5


def test_complex_samples():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((16, 64)) + 1j * rng.standard_normal((16, 64))
    s = statistics(jnp.asarray(x))
    assert jnp.iscomplexobj(s.mean)
    np.testing.assert_allclose(float(s.variance), np.mean(np.abs(x - x.mean()) ** 2))


def test_clip_outliers_pulls_far_values_onto_the_limit():
    from runner.core.stats import clip_outliers

    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 64))
    x[1, 5], x[2, 7] = 1e6, -3e5
    width = 5.0
    median = np.median(x)
    limit = width * np.mean(np.abs(x - median))
    expected = np.clip(x, median - limit, median + limit)
    np.testing.assert_allclose(np.asarray(clip_outliers(jnp.asarray(x), width)), expected, rtol=1e-13)
    assert np.sum(expected != x) == 2  # only the two outliers move
    z = x + 1j * rng.standard_normal((4, 64))
    z[3, 3] = 1e4 + 1e4j
    center = np.median(z.real) + 1j * np.median(z.imag)
    dev = z - center
    limit = width * np.mean(np.abs(dev))
    moved = np.abs(dev) > limit
    expected = np.where(moved, center + dev * limit / np.abs(dev), z)
    np.testing.assert_allclose(np.asarray(clip_outliers(jnp.asarray(z), width)), expected, rtol=1e-12)
    # the direction of a clipped deviation is kept
    out = np.asarray(clip_outliers(jnp.asarray(z), width))[3, 3]
    assert np.isclose(np.angle(out - center), np.angle(z[3, 3] - center))
