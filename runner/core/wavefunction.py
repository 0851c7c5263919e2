"""Applying a model: log psi, what the sampler and local energies evaluate, gradient coordinates."""

import jax
import jax.numpy as jnp

from models import fast_paths
from runner.core import kernels
from runner.core.sampler import Amplitude, plain_amplitude


def apply_model(model, params, sigma_xN, method: str = "__call__"):
    """The model's `method` (log psi by default) of configurations [..., N]: every evaluation of
    a model by the core goes through here. A model with convolutions has each evaluation kept out
    of XLA:CPU's single-kernel loops (`kernels.outside_loop_kernels`), where they run slowly."""
    out = model.apply({"params": params}, sigma_xN, method=method)
    if has_convolution(model, params, sigma_xN, method):
        out = kernels.outside_loop_kernels(out, sigma_xN[..., 0])
    return out


_CONVOLUTIONS: dict = {}  # (model, method, argument shapes) -> whether its evaluation runs a convolution


def has_convolution(model, params, sigma_xN, method: str = "__call__") -> bool:
    """Whether the model's `method` runs a convolution, read from its jaxpr at the shapes of these
    arguments (abstract: no device touched; the CNN convolves through products for some shapes,
    `models.cnn.conv_form`); remembered per model, method and shapes, or read every time for a
    model that cannot be hashed."""
    shapes = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)),
                                    (params, sigma_xN))
    key = (model, method, tuple((x.shape, x.dtype) for x in jax.tree_util.tree_leaves(shapes)))
    try:
        return _CONVOLUTIONS[key]
    except KeyError:
        pass
    except TypeError as error:  # an unhashable model
        if "unhashable" not in str(error):
            raise
        key = None
    jaxpr = jax.make_jaxpr(lambda p, s: model.apply({"params": p}, s, method=method))(*shapes).jaxpr
    found = _has_primitive(jaxpr, "conv_general_dilated")
    if key is not None:
        _CONVOLUTIONS[key] = found
    return found


def _has_primitive(jaxpr, name: str) -> bool:
    """Whether `name` is among the primitives of `jaxpr` or of any jaxpr inside it."""
    def inner(value):
        if hasattr(value, "eqns"):  # a Jaxpr
            return [value]
        if hasattr(value, "jaxpr") and hasattr(value.jaxpr, "eqns"):  # a ClosedJaxpr
            return [value.jaxpr]
        if isinstance(value, (tuple, list)):
            return [j for v in value for j in inner(v)]
        return []

    return any(eqn.primitive.name == name or any(_has_primitive(j, name) for v in eqn.params.values()
                                                 for j in inner(v))
               for eqn in jaxpr.eqns)


def amplitude_of(model) -> Amplitude:
    """What the sampler evaluates for a model: its own cached updates when its class declares
    the `SamplerCache` fast path (the RBM's, O(K M) per move of K spins), else a plain
    log |psi| (the model's `log_abs` method when it has one)."""
    paths = fast_paths.resolve(model)
    if paths is not None and paths.amplitude is not None:
        return Amplitude(*paths.amplitude)
    method = fast_paths.log_abs_method(model)
    return plain_amplitude(lambda params, sigma: jnp.real(apply_model(model, params, sigma, method)))


def ratio_of(model):
    """(params, sigma_N, sites_KxJ, delta_KxJ) -> psi(s'_k) / psi(s) for the local energy,
    from the model's declared `LocalRatios` fast path; None without (full evaluations)."""
    paths = fast_paths.resolve(model)
    return None if paths is None else paths.ratio


def gradient_mode(params, model) -> str:
    """"real" for real parameters (complex ones are split when log psi is not holomorphic),
    "holomorphic" for complex parameters of a holomorphic model."""
    leaves = jax.tree_util.tree_leaves(params)
    if not any(jnp.iscomplexobj(x) for x in leaves):
        return "real"
    return "holomorphic" if getattr(model, "holomorphic", False) else "split"


def to_split(z_P):
    """Complex vector -> real vector (Re z, Im z): the coordinates of non-holomorphic models."""
    return jnp.concatenate([jnp.real(z_P), jnp.imag(z_P)])


def from_split(v_2P):
    """Inverse of `to_split`."""
    n = v_2P.shape[0] // 2
    return v_2P[:n] + 1j * v_2P[n:]
