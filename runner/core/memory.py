"""Chunks from a memory budget: how many samples a step evaluates at once so that its batch fits.

The estimate is a pure function of the model, the Hamiltonian and the sampler's sizes (read from
jaxprs, no device touched), never of the machine or the layout: every process and every layout
picks the same chunks, and so computes the same bits.
"""

import itertools
import warnings

import jax
import jax.numpy as jnp
import numpy as np

GIB = 1024**3


def _jaxprs(value):
    """The jaxprs held by an equation's parameter (sub-programs of pjit, scan, custom rules)."""
    if hasattr(value, "eqns"):
        return [value]
    if hasattr(value, "jaxpr") and hasattr(value.jaxpr, "eqns"):
        return [value.jaxpr]
    if isinstance(value, (tuple, list)):
        return [j for v in value for j in _jaxprs(v)]
    return []


def _size(var) -> int:
    return int(np.prod(var.aval.shape)) if hasattr(var.aval, "shape") else 0


# Operations whose results XLA writes to memory (library calls, reductions, data movement it does
# not fuse), and those that read their operands from memory. Every other operation is elementwise
# or a reshaping that XLA fuses into its consumers, so its result is never held in full.
_WRITTEN = ("dot_general", "conv_general_dilated", "gather", "scatter", "scatter-add", "scatter_add", "sort",
            "reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or", "argmax", "argmin",
            "cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp", "concatenate", "dynamic_update_slice")
_READ = ("dot_general", "conv_general_dilated", "gather", "scatter", "scatter-add", "scatter_add", "sort",
         "cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp", "dynamic_update_slice")


_INLINED = ("pjit", "jit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr",
            "remat", "checkpoint")


def _subprograms(eqn):
    return [j for v in eqn.params.values() for j in _jaxprs(v)]


def _flat(jaxpr, names, counter):
    """`jaxpr`'s operations with the sub-programs that only group operations (`_INLINED`) spliced
    in: [(primitive name, input keys, [(output key, size)], loop bodies)], each value keyed by a
    number (`names`: keys of this program's values so far; a literal's key is None)."""
    def key(v):
        return None if hasattr(v, "val") else names.setdefault(v, next(counter))

    ops = []
    for eqn in jaxpr.eqns:
        subs = _subprograms(eqn)
        if eqn.primitive.name in _INLINED and subs and len(subs[0].invars) == len(eqn.invars):
            inner = {v: key(x) for v, x in zip(subs[0].invars, eqn.invars) if key(x) is not None}
            ops += _flat(subs[0], inner, counter)
            for out, v in zip(eqn.outvars, subs[0].outvars):
                if not hasattr(v, "val"):
                    names[out] = inner.setdefault(v, next(counter))
            continue
        ops.append((eqn.primitive.name, [key(v) for v in eqn.invars], [(key(v), _size(v)) for v in eqn.outvars], subs))
    return ops


def _peak(jaxpr, varying) -> int:
    """The most numbers that depend on the configuration and are held at once while `jaxpr` runs,
    in its order: results of `_WRITTEN` operations and of loops, operands of `_READ` operations
    and of loops, and the program's inputs and outputs (other values are fused into their
    consumers), each freed after its last use. `varying`: which inputs depend on the
    configuration; values of the parameters alone are the same for every sample, not counted."""
    counter = itertools.count()
    names = {v: next(counter) for v in jaxpr.invars}
    depends = {names[v] for v, d in zip(jaxpr.invars, varying) if d}
    sizes = {names[v]: _size(v) for v in jaxpr.invars}
    ops = _flat(jaxpr, names, counter)
    outs = {names.get(v) for v in jaxpr.outvars if not hasattr(v, "val")}
    held, last = set(depends) | outs, dict.fromkeys(outs, len(ops))
    for i, (name, ins, made, subs) in enumerate(ops):
        if subs or name in _WRITTEN:
            held.update(k for k, _ in made)
        if subs or name in _READ:
            held.update(k for k in ins if k is not None)
        last.update((k, i) for k in ins if k is not None)
    alive = peak = sum(sizes[k] for k in depends)
    for i, (name, ins, made, subs) in enumerate(ops):
        varies = [k in depends for k in ins]
        if not any(varies):
            continue
        inner = max((_peak(j, varies if len(j.invars) == len(ins) else [True] * len(j.invars)) for j in subs),
                    default=0)
        depends.update(k for k, _ in made)
        sizes.update(made)
        new = sum(n for k, n in made if k in held)
        peak = max(peak, alive + inner + new)
        alive += new - sum(n for k, n in made if k in held and k not in last)
        alive -= sum(sizes[k] for k in set(ins) if k in depends and k in held and last.get(k) == i)
    return peak


_SIZES: dict = {}  # (model, n_sites) -> `model_sizes`


def model_sizes(model, n_sites: int) -> tuple[int, int]:
    """(numbers the model's log psi holds at once for one configuration; numbers its gradient with
    respect to the parameters holds, the forward pass's residuals and the result included), the
    `_peak`s of their jaxprs, read abstractly (no device touched) and remembered per model."""
    key = (model, n_sites)
    try:
        return _SIZES[key]
    except (KeyError, TypeError):  # not yet, or an unhashable model
        pass
    # Traced with x64 off, as `runner.app` builds (before x64 is set): the jaxpr, so the chunk and the
    # fingerprint, would otherwise depend on the process's x64 flag (608 against 960 for the 4x4 CNN).
    with warnings.catch_warnings(), jax.enable_x64(False):  # float64 requests warn of truncation
        warnings.simplefilter("ignore")
        sizes = tuple(_traced_sizes(model, n_sites))
    try:
        _SIZES[key] = sizes
    except TypeError:
        pass
    return sizes


def _traced_sizes(model, n_sites: int) -> list[int]:
    """`model_sizes`, traced."""
    sigma = jax.ShapeDtypeStruct((1, n_sites), jnp.int8)
    params = jax.eval_shape(lambda s: model.init(jax.random.PRNGKey(0), s), sigma)

    def log_psi(p, s):
        return model.apply(p, s)

    def gradient(p, s):
        return jax.grad(lambda q: jnp.real(jnp.sum(model.apply(q, s))))(p)

    fixed = len(jax.tree_util.tree_leaves(params))
    sizes = []
    for f in (log_psi, gradient):
        closed = jax.make_jaxpr(f)(params, sigma)
        sizes.append(_peak(closed.jaxpr, [False] * fixed + [True] * (len(closed.jaxpr.invars) - fixed)))
    return sizes


def bytes_per_sample(model, n_sites: int, n_connected: int, itemsize: int) -> int:
    """Memory one sample takes in a step: log psi of its connected configurations (the local
    energy), the gradient of log psi at the sample (residuals and its row of log-derivatives), and
    two more copies of that row for centring and the products."""
    forward, gradient = model_sizes(model, n_sites)
    return itemsize * (n_connected * forward + 3 * gradient)


def chunk_for(n_samples: int, n_chains: int, per_sample: int, budget_bytes: float) -> int | None:
    """The largest chunk (a multiple of n_chains whose part per chain divides the samples per chain,
    as `chunk_size` must) whose samples take at most `budget_bytes`; None when all fit at once;
    one sample per chain when not even that fits."""
    if per_sample * n_samples <= budget_bytes:
        return None
    per_chain = n_samples // n_chains
    fitting = max(1, int(budget_bytes // (per_sample * n_chains)))
    return n_chains * max(d for d in range(1, min(fitting, per_chain) + 1) if per_chain % d == 0)
