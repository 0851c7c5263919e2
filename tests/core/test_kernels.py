"""XLA:CPU's single-kernel loops (`runner.parallel.runtime.SMALL_LOOP_BYTES`) never hold a convolution:
a model with convolutions has every evaluation tied to `kernels.outside_loop_kernels`, which
changes no number."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import models
from runner.core import kernels, wavefunction
from runner.core import sampler as smp
from runner.physics import hilbert as hb

LATTICE = hb.square(4, total_sz=0)


@pytest.fixture(autouse=True)
def xla_convolutions(monkeypatch):
    """The CNN through XLA's convolution at every batch (`models.cnn.conv_form` takes products
    for these small lattices and batches), the classification read afresh."""
    from models import cnn

    monkeypatch.setattr(cnn, "conv_form", lambda *shape: "xla")
    monkeypatch.setattr(wavefunction, "_CONVOLUTIONS", {})


def _computations(hlo: str) -> dict:
    """{computation name: its text} of a compiled module's HLO text."""
    out, name = {}, None
    for line in hlo.splitlines():
        head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
        if head:
            name = head.group(1)
            out[name] = []
        elif name is not None:
            out[name].append(line)
    return {k: "\n".join(v) for k, v in out.items()}


def _reached(computations: dict, name: str) -> set:
    """Names of the computations `name` calls, directly or not, itself included."""
    seen, todo = set(), [name]
    while todo:
        current = todo.pop()
        if current in seen or current not in computations:
            continue
        seen.add(current)
        text = computations[current]
        todo += re.findall(r"(?:to_apply|body|condition|calls)=%([\w.\-]+)", text)
        for group in re.findall(r"branch_computations=\{([^}]*)\}", text):
            todo += re.findall(r"%([\w.\-]+)", group)
    return seen


def _loop_kernels_with_convolutions(hlo: str) -> tuple[int, int]:
    """(loops compiled into one kernel that reach a convolution, loops that reach one at all)."""
    computations = _computations(hlo)
    with_conv = {n for n, text in computations.items() if " convolution(" in text}
    kernels = [m.group(1) for m in re.finditer(r"to_apply=%([\w.\-]+)[^\n]*xla_cpu_small_call", hlo)]
    loops = [m.group(1) for m in re.finditer(r" while\([^\n]*body=%([\w.\-]+)", hlo)]
    reach = lambda names: sum(bool(_reached(computations, n) & with_conv) for n in names)  # noqa: E731
    return reach(kernels), reach(loops)


def _cnn_draw_hlo(amplitude):
    model = models.CNN(channels=4, kernel_size=3, depth=2, hilbert=LATTICE, param_dtype=jnp.float64)
    sampler = smp.metropolis_exchange(LATTICE, n_samples=32, n_chains=8)
    params = model.init(jax.random.PRNGKey(0), jnp.ones((1, LATTICE.n_sites), jnp.int8))["params"]
    chains = smp.init_chains(sampler, 0)
    draw = jax.jit(lambda p, c: smp.sample(sampler, amplitude(model), p, c))
    return draw.lower(params, chains).compile().as_text()


def test_metropolis_loops_of_a_cnn_stay_out_of_single_kernels():
    """The CNN's Metropolis loop through the core's evaluation is not compiled into one kernel;
    the same loop around the bare model is (so the threshold is in force and the check can fail)."""
    bare = lambda model: smp.plain_amplitude(  # noqa: E731
        lambda p, s: jnp.real(model.apply({"params": p}, s)))
    kernels, loops = _loop_kernels_with_convolutions(_cnn_draw_hlo(bare))
    assert loops >= 1 and kernels >= 1
    kernels, loops = _loop_kernels_with_convolutions(_cnn_draw_hlo(wavefunction.amplitude_of))
    assert loops >= 1 and kernels == 0


@pytest.mark.parametrize("sector", [None, {"momentum": [0, 0], "irrep": "A1"}])
@pytest.mark.slow
def test_tied_evaluation_is_the_models_own(sector):
    """log psi and its parameter gradient through `wavefunction.apply_model` equal the model's own,
    bit for bit, for configurations with and without batch axes."""
    model = models.CNN(channels=4, kernel_size=3, depth=2, hilbert=LATTICE, param_dtype=jnp.complex128,
                       sector=sector)
    sigma = jax.vmap(lambda k: smp.random_state(LATTICE, k))(jax.random.split(jax.random.PRNGKey(1), 12))
    params = model.init(jax.random.PRNGKey(0), sigma[:1])["params"]
    assert wavefunction.has_convolution(model, params, sigma)
    own = lambda p, s: model.apply({"params": p}, s)  # noqa: E731
    tied = lambda p, s: wavefunction.apply_model(model, p, s)  # noqa: E731
    for s in (sigma, sigma.reshape(3, 4, -1), sigma[0]):
        np.testing.assert_array_equal(jax.jit(tied)(params, s), jax.jit(own)(params, s))
    grad = lambda f: jax.jit(jax.grad(lambda p: jnp.sum(jnp.abs(f(p, sigma)) ** 2)))(params)  # noqa: E731
    for a, b in zip(jax.tree_util.tree_leaves(grad(tied)), jax.tree_util.tree_leaves(grad(own))):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_only_models_with_convolutions_are_tied():
    """The RBM, MLP and ViT keep XLA's single-kernel loops (measured faster there); a stand-in with
    only `apply` (no `init`), as the tests use to strip fast paths, is read too."""
    sigma = jnp.ones((2, LATTICE.n_sites), jnp.int8)

    def found(model):
        params = model.init(jax.random.PRNGKey(0), sigma)["params"]
        return wavefunction.has_convolution(model, params, sigma)

    assert not found(models.RBM(alpha=1))
    assert not found(models.MLP(hidden=(4,)))
    assert not found(models.ViT(patch_size=2, d_model=4, n_heads=1, n_layers=1, hilbert=LATTICE))
    cnn = models.CNN(channels=2, kernel_size=3, depth=1, hilbert=LATTICE)
    assert found(cnn)
    stand_in = type("Plain", (), {"apply": staticmethod(cnn.apply)})()
    params = cnn.init(jax.random.PRNGKey(0), sigma)["params"]
    assert wavefunction.has_convolution(stand_in, params, sigma)
    np.testing.assert_array_equal(wavefunction.apply_model(stand_in, params, sigma),
                                  cnn.apply({"params": params}, sigma))


def test_outside_loop_kernels_passes_values_through():
    """Every value comes back as it went in, non-finite ones included."""
    value = jnp.array([1.5, -jnp.inf, jnp.nan, 0.0 + 0j, 3 - 2j])
    anchor = jnp.array([1, -1, 1, -1, 127], jnp.int8)
    np.testing.assert_array_equal(jax.jit(kernels.outside_loop_kernels)(value, anchor), value)


def test_an_unhashable_model_is_read_every_time():
    """A model that cannot be a cache key (a field holding a dict) is still classified."""
    import flax.linen as nn

    class Conv(nn.Module):
        options: dict

        @nn.compact
        def __call__(self, sigma):
            h = nn.Conv(2, (3,))(sigma[..., None].astype(jnp.float32))
            return jnp.sum(h, axis=(-2, -1))

    model = Conv(options={"a": 1})
    with pytest.raises(TypeError):
        hash(model)
    sigma = jnp.ones((2, 6), jnp.int8)
    params = model.init(jax.random.PRNGKey(0), sigma)["params"]
    assert wavefunction.has_convolution(model, params, sigma)
    assert wavefunction.has_convolution(model, params, sigma)  # again, not from a cache


def test_the_classification_follows_each_shapes_form(monkeypatch):
    """With the CNN's own forms (`models.cnn.conv_form`) a 4 x 4 lattice convolves through
    products at every batch, so nothing is tied; a lattice past the dense form's limit convolves
    through XLA's convolution above the windows' batch, and only those shapes are tied."""
    from models import cnn

    monkeypatch.undo()
    monkeypatch.setattr(wavefunction, "_CONVOLUTIONS", {})
    model = models.CNN(channels=2, kernel_size=3, depth=1, hilbert=LATTICE)
    params = model.init(jax.random.PRNGKey(0), jnp.ones((1, LATTICE.n_sites), jnp.int8))["params"]
    small, large = (jnp.ones((b, LATTICE.n_sites), jnp.int8) for b in (cnn.WINDOW_BATCH, cnn.WINDOW_BATCH + 1))
    assert not wavefunction.has_convolution(model, params, small)
    assert not wavefunction.has_convolution(model, params, large)
    monkeypatch.setattr(cnn, "DENSE_CELLS_PER_WINDOW", 1)
    monkeypatch.setattr(wavefunction, "_CONVOLUTIONS", {})
    assert not wavefunction.has_convolution(model, params, small)
    assert wavefunction.has_convolution(model, params, large)
