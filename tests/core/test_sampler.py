"""Samplers against the exact |psi|^2 (chi-square), Sz conservation, per-chain keys."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as sps

from models import RBM
from runner.core import rules
from runner.core import sampler as smp
from runner.core.wavefunction import amplitude_of
from runner.errors import ConfigError
from runner.physics import hilbert as hb
from runner.physics import replicas
from runner.physics.hilbert import states_to_codes


def _model_and_probs(lattice, seed=0, scale=15.0, dtype=jnp.float64, cached=True):
    """A sharply peaked RBM, its Amplitude (the sampler's input: with the RBM's local-update
    cache, or plain log |psi|) and exact |psi|^2."""
    model = RBM(alpha=1, param_dtype=dtype)
    states = hb.all_states(lattice)
    params = model.init(jax.random.PRNGKey(seed), states[0])["params"]
    params = jax.tree_util.tree_map(lambda x: x * scale, params)
    log_abs = lambda p, s: model.apply({"params": p}, s, method="log_abs")  # noqa: E731
    amplitude = amplitude_of(model) if cached else smp.plain_amplitude(log_abs)
    logp = 2 * np.real(np.asarray(model.apply({"params": params}, jnp.asarray(states))))
    p = np.exp(logp - logp.max())
    return amplitude, params, states, p / p.sum()


def _chi_square_pvalue(samples, states, probs):
    codes = states_to_codes(np.asarray(samples).reshape(-1, states.shape[1]))
    index = {c: i for i, c in enumerate(states_to_codes(states))}
    counts = np.bincount([index[c] for c in codes], minlength=len(states))
    expected = probs * counts.sum()
    keep = expected > 5  # pool the rare states into one bin
    obs = np.append(counts[keep], counts[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return sps.chisquare(obs, exp).pvalue


def _draw_many(sampler, logpsi, params, seed, rounds):
    chains = smp.init_chains(sampler, seed)
    step = jax.jit(functools.partial(smp.sample, sampler, logpsi))
    out = []
    for _ in range(rounds):
        chains, sigma, acc = step(params, chains)
        out.append(np.asarray(sigma))
    return np.concatenate(out, axis=1), float(acc)


@pytest.mark.parametrize(
    "kind,lattice",
    [
        ("local", hb.chain(6)),
        ("exchange", hb.chain(8, total_sz=0)),
        ("exchange", hb.square(Lx=2, Ly=4, pbc=False, total_sz=1)),
        ("exact", hb.chain(6)),
        ("exact", hb.chain(8, total_sz=-1)),
        ("local-complex", hb.chain(6)),
        ("exchange-complex", hb.chain(8, total_sz=0)),
        ("exchange-far", hb.square(Lx=2, Ly=4, pbc=False, total_sz=1)),
        ("local-plain", hb.chain(6)),
    ],
)
@pytest.mark.slow
def test_histogram_matches_exact_distribution(kind, lattice):
    dtype = jnp.complex128 if kind.endswith("complex") else jnp.float64
    cached = not kind.endswith("plain")
    far = {"far_swap": 0.3} if kind.endswith("far") else {}
    kind = kind.split("-")[0]
    logpsi, params, states, probs = _model_and_probs(lattice, dtype=dtype, cached=cached)
    make = {"local": smp.metropolis_local, "exchange": smp.metropolis_exchange, "exact": smp.exact}[kind]
    # Thinned chains (4 sweeps between samples): chi-square assumes independent draws.
    thin = {} if kind == "exact" else {"sweep_size": 4 * lattice.n_sites}
    sampler = make(lattice, n_samples=4096, n_chains=32, **thin, **far)
    samples, acc = _draw_many(sampler, logpsi, params, seed=1, rounds=4)
    assert 0.0 < acc <= 1.0
    if lattice.total_sz is not None:
        assert np.all(np.sum(samples, axis=-1) == 2 * lattice.total_sz)
    assert _chi_square_pvalue(samples, states, probs) > 1e-3


def test_chi_square_detects_wrong_distribution():
    """Guards the test above: a sampler of a different |psi|^2 must fail it."""
    lattice = hb.chain(6)
    logpsi, params, states, probs = _model_and_probs(lattice)
    _, other, _, _ = _model_and_probs(lattice, seed=5)
    sampler = smp.metropolis_local(lattice, n_samples=4096, n_chains=32)
    samples, _ = _draw_many(sampler, logpsi, other, seed=1, rounds=4)
    assert _chi_square_pvalue(samples, states, probs) < 1e-6


@pytest.mark.parametrize("kind", ["local", "exact"])
def test_chain_depends_only_on_its_own_key(kind):
    """Chain c gives the same samples whether it runs with 8 or 16 chains: one key per chain."""
    lattice = hb.chain(6)
    logpsi, params, _, _ = _model_and_probs(lattice)
    make = smp.metropolis_local if kind == "local" else smp.exact
    small = make(lattice, n_samples=64, n_chains=8)
    large = make(lattice, n_samples=128, n_chains=16)
    a, _ = _draw_many(small, logpsi, params, seed=3, rounds=2)
    b, _ = _draw_many(large, logpsi, params, seed=3, rounds=2)
    np.testing.assert_array_equal(a, b[:8])


@pytest.mark.parametrize("kind,dtype", [("local", jnp.float64), ("local", jnp.complex128),
                                        ("exchange", jnp.float64), ("exchange", jnp.complex128)])
@pytest.mark.slow
def test_cached_updates_give_the_same_chains(kind, dtype):
    """The RBM's O(M) local updates reproduce the plain evaluation sample for sample."""
    lattice = hb.chain(8, total_sz=0 if kind == "exchange" else None)
    make = smp.metropolis_exchange if kind == "exchange" else smp.metropolis_local
    sampler = make(lattice, n_samples=512, n_chains=16)
    cached, params, _, _ = _model_and_probs(lattice, scale=8.0, dtype=dtype)
    plain, _, _, _ = _model_and_probs(lattice, scale=8.0, dtype=dtype, cached=False)
    a, acc_a = _draw_many(sampler, cached, params, seed=2, rounds=2)
    b, acc_b = _draw_many(sampler, plain, params, seed=2, rounds=2)
    np.testing.assert_array_equal(a, b)
    assert acc_a == acc_b and 0.02 < acc_a < 0.98


def _moved(sigma, propose, x):
    sites, values, log_q = propose(sigma, x)
    return rules.apply_move(sigma, sites, values), float(log_q)


def test_rules_move_the_right_spins():
    sigma = jnp.array([1, -1, 1, 1, -1, -1], jnp.int8)
    bonds = np.array([[0, 1], [2, 3], [4, 5], [3, 4]])  # bonds 0 and 3 have differing spins
    swap = rules.exchange_rule(bonds).propose
    moved, log_q = _moved(sigma, swap, 0.1)  # first of the two hoppable bonds
    np.testing.assert_array_equal(moved, [-1, 1, 1, 1, -1, -1])
    assert log_q == 0.0  # still two hoppable bonds after the swap
    moved, log_q = _moved(sigma, swap, 0.7)  # second one: [3, 4]
    np.testing.assert_array_equal(moved, [1, -1, 1, -1, 1, -1])
    assert log_q == pytest.approx(np.log(2 / 4))  # four hoppable bonds after it
    polarised = jnp.ones(6, jnp.int8)
    moved, log_q = _moved(polarised, swap, 0.5)
    np.testing.assert_array_equal(moved, polarised)
    assert log_q == 0.0
    moved, log_q = _moved(sigma, rules.local_rule(6).propose, 4)
    np.testing.assert_array_equal(moved, [1, -1, 1, 1, 1, -1])
    assert log_q == 0.0


@pytest.mark.parametrize("lattice", [hb.chain(8, total_sz=0), hb.square(Lx=2, Ly=3, pbc=False, total_sz=1)])
def test_exchange_kernel_keeps_psi_squared_exactly(lattice):
    """The exact Metropolis-Hastings kernel built from the exchange rule (every hoppable bond,
    its Hastings correction, min(1, ratio) acceptance) leaves |psi|^2 invariant: pi P = pi."""
    _, params, states, probs = _model_and_probs(lattice, scale=3.0)
    bonds = np.asarray(lattice.bonds)
    propose = jax.jit(jax.vmap(rules.exchange_rule(bonds).propose))
    index = {c: i for i, c in enumerate(states_to_codes(states))}
    n_hop = (states[:, bonds[:, 0]] != states[:, bonds[:, 1]]).sum(1)
    src = np.repeat(np.arange(len(states)), n_hop)
    k = np.concatenate([np.arange(n) for n in n_hop])
    u = (k + 0.5) / n_hop[src]
    sites, values, log_q = propose(jnp.asarray(states[src], jnp.int8), jnp.asarray(u))
    moved = np.asarray(jax.vmap(rules.apply_move)(jnp.asarray(states[src], jnp.int8), sites, values))
    dst = np.array([index[c] for c in states_to_codes(moved)])
    assert np.all(dst != src)  # a hoppable swap always moves
    accept = np.minimum(1.0, probs[dst] / probs[src] * np.exp(np.asarray(log_q, np.float64)))
    P = np.zeros((len(states), len(states)))
    np.add.at(P, (src, dst), accept / n_hop[src])
    P[np.diag_indices_from(P)] += 1.0 - P.sum(1)
    np.testing.assert_allclose(probs @ P, probs, rtol=1e-12, atol=1e-15)
    # A kernel without the correction would not: the test can tell.
    P0 = np.zeros_like(P)
    np.add.at(P0, (src, dst), np.minimum(1.0, probs[dst] / probs[src]) / n_hop[src])
    P0[np.diag_indices_from(P0)] += 1.0 - P0.sum(1)
    assert np.max(np.abs(probs @ P0 - probs)) > 1e-4


def test_initial_states_respect_sector():
    lattice = hb.chain(10, total_sz=1)
    sampler = smp.metropolis_exchange(lattice, n_samples=64, n_chains=16)
    chains = smp.init_chains(sampler, 0)
    assert np.all(np.asarray(chains.sigma_CxN).sum(axis=1) == 2)
    assert len({tuple(x) for x in np.asarray(chains.sigma_CxN)}) > 1


def test_a_fixed_sz_space_is_sampled_by_sz_conserving_moves_that_reach_every_configuration():
    """Single flips leave a fixed-Sz sector and are refused there; exchange needs a fixed Sz; and exchange
    along bonds that split the sites into groups (no swap moves an up spin between them: frozen
    chains) is refused, unless the sector has one configuration per group split or the groups are copies."""
    with pytest.raises(ConfigError, match="metropolis_local flips single spins and cannot keep hilbert.total_sz"):
        smp.metropolis_local(hb.chain(8, total_sz=0))
    with pytest.raises(ConfigError, match="needs hilbert.total_sz"):
        smp.metropolis_exchange(hb.chain(8))
    apart = [[0, 1], [1, 2], [3, 4], [4, 5]]  # two triangles' worth of sites, never joined
    with pytest.raises(ConfigError, match="split the 6 sites into 2 groups"):
        smp.metropolis_exchange(hb.graph(6, apart, total_sz=0), n_samples=32, n_chains=16)
    assert rules.bond_groups(6, apart) == 2 and rules.bond_groups(7, apart) == 3  # a site without bonds is one
    smp.metropolis_exchange(hb.graph(6, apart, total_sz=3), n_samples=32, n_chains=16)  # polarised: one state
    smp.metropolis_exchange(replicas.hilbert(hb.chain(6, total_sz=0), 3), n_samples=32, n_chains=16)
    for lattice in (hb.chain(8, pbc=False, total_sz=0), hb.kagome(L=2, total_sz=0), hb.triangular(L=4, total_sz=0)):
        assert rules.exchange_issue(lattice.n_sites, lattice.bonds, 1, lattice.n_up) is None


def test_far_swaps_keep_psi_squared_and_each_copy_s_sz():
    """swap_any_pair's kernel (every site, every opposite spin of its copy) leaves |psi|^2 invariant with
    no Hastings correction, and never swaps across copies; far_swap is a probability."""
    lattice = hb.chain(6, total_sz=0)
    _, params, states, probs = _model_and_probs(lattice, scale=3.0)
    propose = jax.jit(jax.vmap(functools.partial(rules.swap_any_pair, copies=1)))
    n, index = lattice.n_sites, {c: i for i, c in enumerate(states_to_codes(states))}
    src = np.repeat(np.arange(len(states)), n * (n // 2))  # every site i, then each of its n/2 opposite spins
    u = np.stack([np.tile(np.repeat((np.arange(n) + 0.5) / n, n // 2), len(states)),
                  np.tile((np.arange(n // 2) + 0.5) / (n // 2), n * len(states))], axis=1)
    sites, values, log_q = propose(jnp.asarray(states[src], jnp.int8), jnp.asarray(u))
    moved = np.asarray(jax.vmap(rules.apply_move)(jnp.asarray(states[src], jnp.int8), sites, values))
    dst = np.array([index[c] for c in states_to_codes(moved)])
    assert np.all(dst != src) and np.all(np.asarray(log_q) == 0)
    accept = np.minimum(1.0, probs[dst] / probs[src])
    P = np.zeros((len(states), len(states)))
    np.add.at(P, (src, dst), accept / (n * (n // 2)))
    P[np.diag_indices_from(P)] += 1.0 - P.sum(1)
    np.testing.assert_allclose(probs @ P, probs, rtol=1e-12, atol=1e-15)
    sigma = jnp.array([1, -1, 1, -1, 1, 1, -1, -1], jnp.int8)  # two copies of 4 sites
    key = jax.random.PRNGKey(0)
    moved = jax.vmap(lambda u: rules.apply_move(sigma, *rules.swap_any_pair(sigma, u, copies=2)[:2]))(
        jax.random.uniform(key, (256, 2)))
    np.testing.assert_array_equal(np.asarray(moved).reshape(256, 2, 4).sum(-1), np.zeros((256, 2)))
    apart = hb.graph(6, [[0, 1], [1, 2], [3, 4], [4, 5]], total_sz=0)
    assert smp.metropolis_exchange(apart, n_samples=32, n_chains=16, far_swap=0.1).rule.draw(key, 3).shape == (3, 4)
    with pytest.raises(ConfigError, match="is a probability"):
        smp.metropolis_exchange(hb.chain(8, total_sz=0), far_swap=1.5)


def test_a_full_sum_with_beyond_sums_where_the_space_fits_and_samples_beyond_it():
    """`full_sum(beyond=...)`: the full sum up to 2^16 states, the named Markov chain sampler (its
    n_samples, or its default) beyond; without `beyond` a space beyond is refused, naming both ways."""
    small = hb.square(L=4, total_sz=0)  # 12870 states
    assert isinstance(smp.full_sum(small, symmetry="lattice", beyond="metropolis_exchange"), smp.FullSumSampler)
    large = hb.square(L=6, total_sz=0)
    chain = smp.full_sum(large, n_chains=8, symmetry="lattice", n_samples=256, beyond="metropolis_exchange")
    assert isinstance(chain, smp.MetropolisSampler)
    assert (chain.n_samples, chain.n_chains, chain.hilbert) == (256, 8, large)
    assert smp.full_sum(large, beyond="metropolis_exchange").n_samples == 1024
    assert isinstance(smp.full_sum(hb.chain(L=20), beyond="metropolis_local"), smp.MetropolisSampler)
    with pytest.raises(ConfigError, match="sampler.beyond=metropolis_exchange or sampler=metropolis_exchange"):
        smp.full_sum(large)
    with pytest.raises(ConfigError, match="beyond"):
        smp.full_sum(small, beyond="metropolis")
    with pytest.raises(ConfigError, match="total_sz"):  # local flips in a fixed-Sz space: the sampler's own refusal
        smp.full_sum(large, beyond="metropolis_local")
