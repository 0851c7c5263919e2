"""The VMC core, written once in the global view.

Samples carry a leading chain axis C (sharded over the mesh by the caller's shardings);
parameters and statistics are replicated. Every sum over samples is taken per chain and the C
partials combined in a fixed order (`runner.core.stats.chain_sum`), never by a reduction over the
sharded axis (whose all-reduce order depends on the layout): a run gives the same bits on one
device, several, or several processes, and no backend has its own path.
"""

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree

from models import fast_paths
from runner.core import kernels
from runner.core.local_energy import connected, flip_masks, local_energy, sum_elements
from runner.core.precond import Jacobian, Preconditioner, SampleChunks, from_products
from runner.core.sampler import (
    Amplitude,
    ChainState,
    FullSumSampler,
    MetropolisSampler,
    full_sum_weights,
    importance_weights,
    init_chains,
    plain_amplitude,
    sample,
    symmetry_group,
    training_power,
)
from runner.core.stats import (
    chain_max,
    chain_mean,
    chain_sum,
    clip_outliers,
    effective_sample_fraction,
    statistics,
    weighted_chain_sums,
    weighted_mean,
)
from runner.physics.pauli import Hamiltonian


class VMCState(NamedTuple):
    """Everything a run needs to continue exactly: parameters, optimizer, chains, step."""

    params: Any
    opt_state: Any
    chains: ChainState
    step: jax.Array  # int32 scalar, number of completed VMC steps
    solver: Any  # the preconditioner's state (CG: warm start and deflation basis)
    guard: Any = ()  # a `Guard` with `Problem.reject_jump`, else ()


class Guard(NamedTuple):
    """What rejecting a step needs: the state the last accepted step started from, its energy
    estimate, and the factor on the next update."""

    params: Any
    opt_state: Any
    solver: Any
    energy: jax.Array  # real scalar; +inf before the first step (nothing to compare with)
    error: jax.Array
    scale: jax.Array  # 1, halved by each rejection, doubled (up to 1) by each accepted step


@dataclasses.dataclass(frozen=True)
class Problem:
    """The static parts of a VMC run (closed over by the jitted step).

    Attributes:
        hamiltonian: connected-element Hamiltonian.
        model: Flax module mapping spins [..., N] -> log psi [...].
        sampler: a sampler from `runner.core.sampler`.
        optimizer: an optax GradientTransformation.
        precondition: a `runner.core.precond.Preconditioner`.
        chunk_size: evaluate local energies, log-derivatives and SR's products with them
            (CG) on at most this many samples at a time (a multiple of n_chains), or None for
            all at once.
        clip_local_energy: for the gradient only, local energies farther than this many mean
            absolute deviations from their median are pulled back onto that distance
            (`stats.clip_outliers`); None: no clipping. The energy statistics use the raw values.
        learning_rate: the optimizer's learning-rate schedule (a function of the step, which
            optax reads from its own count: the VMC step, less two per step undone by
            `reject_jump`), reported in the metrics; None when the learning rate is a number.
        reject_jump: k: a step whose samples estimate the energy more than k combined error
            bars above the last accepted step's estimate is undone (`vmc_step`); None: off.
    """

    hamiltonian: Hamiltonian
    model: Any
    sampler: Any
    optimizer: optax.GradientTransformation
    precondition: Preconditioner
    chunk_size: int | None = None
    learning_rate: Any = None
    clip_local_energy: float | None = None
    reject_jump: float | None = None

    def logpsi(self, params, sigma_xN):
        return apply_model(self.model, params, sigma_xN)

    @property
    def amplitude(self) -> Amplitude:
        return amplitude_of(self.model)

    @property
    def chunk_per_chain(self) -> int | None:
        if self.chunk_size is None:
            return None
        return max(1, self.chunk_size // self.sampler.n_chains)


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


def init_state(problem: Problem, seed: int, sample_sigma_N) -> VMCState:
    """Initial parameters (from the seed), optimizer state and chains."""
    key = jax.random.fold_in(jax.random.PRNGKey(seed), 2**31 - 1)
    params = problem.model.init(key, sample_sigma_N)["params"]
    flat, _ = ravel_pytree(params)
    if gradient_mode(params, problem.model) == "split":
        flat = to_split(flat)
    opt_state, solver = problem.optimizer.init(params), problem.precondition.init(flat)
    guard = ()
    if problem.reject_jump is not None:
        real = jnp.finfo(flat.dtype).dtype
        guard = Guard(params, opt_state, solver, jnp.asarray(jnp.inf, real), jnp.zeros((), real), jnp.ones((), real))
    return VMCState(params, opt_state, init_chains(problem.sampler, seed), jnp.zeros((), jnp.int32), solver, guard)


def map_over_samples(fn, sigma_CxTxN, chunk_per_chain):
    """Applies fn to [C, t, N] blocks of samples, `chunk_per_chain` samples per chain at a time.

    The chain axis stays leading (and sharded); chunks run one after another.
    """
    C, T = sigma_CxTxN.shape[:2]
    if chunk_per_chain is None or chunk_per_chain >= T:
        return fn(sigma_CxTxN)
    n = T // chunk_per_chain
    blocks = jnp.swapaxes(sigma_CxTxN.reshape(C, n, chunk_per_chain, -1), 0, 1)
    out = jax.lax.map(fn, blocks)
    return jax.tree_util.tree_map(
        lambda y: jnp.swapaxes(y, 0, 1).reshape(C, T, *y.shape[3:]), out
    )


def local_energies(problem: Problem, params, sigma_CxTxN):
    """E_loc for every sample, [C, T], in the parameters' precision (32-bit parameters under
    x64, i.e. mixed precision, would otherwise get 64-bit E_loc from the 64-bit matrix elements).

    A model without the `LocalRatios` fast path is evaluated only on the connected
    configurations whose matrix element is nonzero (`nonzero_local_energies`)."""
    ratio_fn = ratio_of(problem.model)
    if ratio_fn is None and problem.hamiltonian.n_connected:
        fn = functools.partial(nonzero_local_energies, problem.hamiltonian, problem.logpsi, params)
    else:
        fn = jax.vmap(jax.vmap(functools.partial(local_energy, problem.hamiltonian, problem.logpsi, params,
                                                 ratio_fn=ratio_fn)))
    eloc_CxT = map_over_samples(fn, sigma_CxTxN, problem.chunk_per_chain)
    real = jnp.finfo(jax.tree_util.tree_leaves(params)[0].dtype).dtype
    return eloc_CxT.astype(jnp.promote_types(real, jnp.float32) if jnp.isrealobj(eloc_CxT)
                           else jnp.promote_types(real, jnp.complex64))


def local_energies_of(problem: Problem, params, sigma_KxN):
    """E_loc of any configurations [K, N] (not a multiple of the chains: no chunks), as NumPy [K]."""
    plain = dataclasses.replace(problem, chunk_size=None)
    return np.asarray(local_energies(plain, params, jnp.asarray(sigma_KxN, jnp.int8)[None]))[0]


# The nonzero (sample, connected configuration) pairs of a chain are evaluated in blocks of
# 1/NONZERO_BLOCKS of all its pairs: at most that fraction of the full work is spent on padding,
# and the model sees C x block configurations at a time (memory bounded by the block). Each block
# is one more copy of the model in the compiled step: more blocks waste less and compile longer
# (bench: docs/benchmarks.md, "Deep models").
NONZERO_BLOCKS = 16


def nonzero_local_energies(ham: Hamiltonian, logpsi_fn, params, sigma_CxTxN):
    """E_loc [C, T] as `runner.core.local_energy.local_energy` gives it, evaluating log psi only on the
    connected configurations with a nonzero matrix element.

    In an Sz sector a Heisenberg bond connects only where its two spins differ, so about half
    of the K flip masks of a sample give a zero element; a generic model's cost is its number of
    evaluations. Per chain the nonzero pairs (t, k) are packed in (t, k) order and evaluated
    block by block, the blocks past every chain's last nonzero pair skipped; the
    per-pair log psi are then read back into [C, T, K] and summed over k exactly as
    `local_energy` sums them (zero elements never multiply their ratio).

    Args:
        ham: the Hamiltonian, with n_connected > 0.
        logpsi_fn: (params, sigma_xN) -> log psi [...], batched over leading axes.
        params: model parameters.
        sigma_CxTxN: samples (int8 spins), C chains of T.

    Returns:
        E_loc [C, T], complex when log psi or an element is complex.
    """
    C, T, N = sigma_CxTxN.shape
    _, mel_CxTxK, diag_CxT = jax.vmap(jax.vmap(functools.partial(connected, ham)))(sigma_CxTxN)
    K = mel_CxTxK.shape[-1]
    M = T * K
    block = -(-M // NONZERO_BLOCKS)
    nonzero_CxM = (mel_CxTxK != 0).reshape(C, M)
    count_C = jnp.sum(nonzero_CxM, axis=1, dtype=jnp.int32)
    # Nonzero pairs first, each group in increasing (t, k) order; padded to whole blocks.
    order_CxM = jnp.argsort(~nonzero_CxM, axis=1, stable=True).astype(jnp.int32)
    order_CxM = jnp.pad(order_CxM, ((0, 0), (0, NONZERO_BLOCKS * block - M)))
    masks_KxN = jnp.asarray(flip_masks(ham), sigma_CxTxN.dtype)
    logpsi_CxT = logpsi_fn(params, sigma_CxTxN)
    n_done = jnp.max(count_C)  # over all chains: the same blocks run on every layout

    def evaluate(i):
        pair_CxB = order_CxM[:, i * block:(i + 1) * block]
        sigma_CxBxN = jnp.take_along_axis(sigma_CxTxN, (pair_CxB // K)[..., None], axis=1)
        return logpsi_fn(params, sigma_CxBxN * masks_KxN[pair_CxB % K]).astype(logpsi_CxT.dtype)

    # One conditional per block, not a loop: XLA:CPU compiles a loop with a small carry into a
    # single kernel (runner.parallel.runtime.SMALL_LOOP_BYTES), whose matrix products run about 2x slower.
    skipped_CxB = jnp.zeros((C, block), logpsi_CxT.dtype)
    packed_CxM = jnp.concatenate([jax.lax.cond(i * block < n_done, functools.partial(evaluate, i), lambda: skipped_CxB)
                                  for i in range(NONZERO_BLOCKS)], axis=1)
    # Pair m's place in the packed list is the number of nonzero pairs before it.
    rank_CxM = jnp.cumsum(nonzero_CxM, axis=1, dtype=jnp.int32) - 1
    logpsi_CxTxK = jnp.take_along_axis(packed_CxM, jnp.maximum(rank_CxM, 0), axis=1).reshape(C, T, K)
    return sum_elements(diag_CxT, mel_CxTxK, jnp.exp(logpsi_CxTxK - logpsi_CxT[..., None]))


def _flat_logpsi(problem: Problem, params, mode, block=None):
    """(theta, to_params, f) with f(theta, sigma_xN) = log psi, theta the flat parameters in
    the coordinates of `mode` (real and imaginary parts side by side for "split") and
    to_params mapping them back to the parameter pytree. With `block` = (i, j): theta holds
    only the leaves i .. j - 1 of the tree (in `ravel_pytree`'s order), the others fixed."""
    if block is None:
        flat, to_tree = ravel_pytree(params)
    else:
        leaves, treedef = jax.tree_util.tree_flatten(params)
        i, j = block
        flat, unravel = ravel_pytree(leaves[i:j])
        to_tree = lambda v: jax.tree_util.tree_unflatten(treedef, [*leaves[:i], *unravel(v), *leaves[j:]])  # noqa: E731
    if mode == "split":
        flat = to_split(flat)
        to_params = lambda v: to_tree(from_split(v))  # noqa: E731
    else:
        to_params = to_tree
    return flat, to_params, lambda v, s: problem.logpsi(to_params(v), s)


def log_derivatives(problem: Problem, params, sigma_CxTxN, mode):
    """O = d log psi / d theta for every sample, [C, T, P], with theta the flat parameters.

    mode "real": real theta (log psi may be complex: O = dRe/dtheta + i dIm/dtheta);
    mode "holomorphic": complex theta, O = d log psi / dz;
    mode "split": complex theta of a non-holomorphic model, as the real vector (Re z, Im z).
    """
    return map_over_samples(
        _per_sample_derivatives(problem, params, mode, sigma_CxTxN[0, 0]), sigma_CxTxN, problem.chunk_per_chain
    )


def _per_sample_derivatives(problem: Problem, params, mode, sigma_N, block=None):
    """sigma [C, t, N] -> O [C, t, P] (see `log_derivatives`), for blocks of samples like sigma_N;
    with `block`, the derivatives by that block of leaves only (`_flat_logpsi`)."""
    flat, _, f = _flat_logpsi(problem, params, mode, block)
    if mode == "holomorphic":
        grad = jax.grad(f, holomorphic=True)
    elif jnp.iscomplexobj(jax.eval_shape(f, flat, sigma_N)):
        re, im = jax.grad(lambda v, s: jnp.real(f(v, s))), jax.grad(lambda v, s: jnp.imag(f(v, s)))
        grad = lambda v, s: re(v, s) + 1j * im(v, s)  # noqa: E731
    else:
        grad = jax.grad(f)
    per_sample = jax.vmap(jax.vmap(grad, in_axes=(None, 0)), in_axes=(None, 0))
    return lambda sigma_CxtxN: per_sample(flat, sigma_CxtxN)


def _accumulate_over_samples(fn, sigma_CxTxN, w_CxT, chunk_per_chain):
    """sum over chunks of fn(sigma [C, t, N], w [C, t]) -> per-chain partials [C, ...], the
    chunks (`chunk_per_chain` samples of every chain) added one after another in order."""
    C, T = sigma_CxTxN.shape[:2]
    if chunk_per_chain is None or chunk_per_chain >= T:
        return fn(sigma_CxTxN, w_CxT)
    n = T // chunk_per_chain
    sigma_nxCxtxN = jnp.swapaxes(sigma_CxTxN.reshape(C, n, chunk_per_chain, -1), 0, 1)
    w_nxCxt = jnp.swapaxes(w_CxT.reshape(C, n, chunk_per_chain), 0, 1)
    add = lambda acc, block: (jax.tree_util.tree_map(jnp.add, acc, fn(*block)), None)  # noqa: E731
    return jax.lax.scan(add, fn(sigma_nxCxtxN[0], w_nxCxt[0]), (sigma_nxCxtxN[1:], w_nxCxt[1:]))[0]


def _block_products(problem: Problem, params, mode):
    """sigma [C, t, N] -> (jvp: v_P -> d log psi [C, t], transpose: c [C, t] -> the per-chain
    sums sum_t c_ct O_ct [C, P], no conjugation) for a block of samples, with whatever the
    products share (the model's tables, or jax.linearize's residuals) computed once per block."""
    flat, to_params, f = _flat_logpsi(problem, params, mode)
    paths = fast_paths.resolve(problem.model)
    if mode != "split" and paths is not None and paths.jacobian_products is not None:
        def products(sigma_CxtxN):
            model_jvp, model_transpose = paths.jacobian_products(params, sigma_CxtxN)
            # ravel_pytree's order per chain: vmap the flattening over the leading chain axis.
            ravel_C = jax.vmap(lambda tree: ravel_pytree(tree)[0])
            return lambda v: model_jvp(to_params(v)), lambda c: ravel_C(model_transpose(c))
        return products

    def products(sigma_CxtxN):
        # A copy of the parameters per chain, so the transpose gives per-chain sums.
        flat_CxP = jnp.broadcast_to(flat, (sigma_CxtxN.shape[0], flat.shape[0]))
        _, lin = jax.linearize(lambda u_CxP: jax.vmap(f)(u_CxP, sigma_CxtxN), flat_CxP)
        lin_T = jax.linear_transpose(lin, flat_CxP)
        return lambda v: lin(jnp.broadcast_to(v, flat_CxP.shape)), lambda c: lin_T(c)[0]
    return products


def centred(x_CxTx, w_CxT=None):
    """The rows of the natural gradient's Jacobian or residuals: (x - <x>) / sqrt(N_s) for
    samples of |psi|^2 (w None), sqrt(w) (x - sum w x) for weights w [C, T] (a full sum's, or
    importance weights; 0 where w is 0). Sums are `chain_mean` / `weighted_mean`: the same bits
    on every layout."""
    if w_CxT is None:
        n_samples = x_CxTx.shape[0] * x_CxTx.shape[1]
        return (x_CxTx - chain_mean(x_CxTx)) / jnp.sqrt(n_samples)
    return _root_weighted(x_CxTx, w_CxT, weighted_mean(x_CxTx, w_CxT))


def _root_weighted(x_CxTx, w_CxT, mean):
    """sqrt(w) (x - mean), 0 where w is 0 (x may be anything there)."""
    w = w_CxT.reshape(w_CxT.shape + (1,) * (x_CxTx.ndim - 2))
    return jnp.where(w > 0, jnp.sqrt(w) * (x_CxTx - mean), 0)


def _centred_cotangent(c_CxT, w_CxT=None):
    """c' with sum_s O_s c'_s = sum_s Obar_s c_s for Obar = `centred`(O): centring the
    cotangent instead of O. With weights: c' = sqrt(w) c - w sum sqrt(w) c."""
    if w_CxT is None:
        return centred(c_CxT)
    root_c = jnp.where(w_CxT > 0, jnp.sqrt(w_CxT) * c_CxT, 0)
    return root_c - w_CxT * chain_sum(jnp.sum(root_c, axis=1))


def jacobian(problem: Problem, params, sigma_CxTxN, mode, w_CxT=None) -> Jacobian:
    """The centred, scaled log-derivatives Obar = (O - <O>) / sqrt(N_s) of the samples (with
    weights w: sqrt(w) (O - sum w O), `centred`), both as a dense matrix (built only
    if a preconditioner asks) and as products with vectors (a forward and a transposed
    derivative of log psi over the batch, O never formed).

    Every sum over samples is taken per chain and the chains combined by `chain_sum`, so the
    products are bitwise the same on every layout. With `chunk_size` the products go
    `chunk_per_chain` samples of every chain at a time, recomputing what they share for each
    chunk (memory bounded by the chunk; the transpose adds the chunks' partials in order);
    without, that is computed once for the whole batch. The same chunks give minSR Obar
    chunk by chunk (`SampleChunks`, made again each time one is asked for).
    """
    C, T = sigma_CxTxN.shape[:2]
    n_samples = C * T

    def dense():
        O_CxTxP = log_derivatives(problem, params, sigma_CxTxN, mode)
        Obar_SxP = centred(O_CxTxP, w_CxT).reshape(n_samples, -1)
        # Materialise the transpose: left to itself XLA folds it into the products that
        # follow and picks a layout about 2x slower on CPU.
        return jax.lax.optimization_barrier(Obar_SxP.T)

    flat, _, f = _flat_logpsi(problem, params, mode)
    out_dtype = jax.eval_shape(f, flat, sigma_CxTxN[0]).dtype
    products = _block_products(problem, params, mode)
    chunk = problem.chunk_per_chain
    if chunk is None or chunk >= T:
        jvp_CxT, transpose_CxP = products(sigma_CxTxN)
    else:
        jvp_CxT = lambda v: map_over_samples(lambda s: products(s)[0](v), sigma_CxTxN, chunk)  # noqa: E731
        transpose_CxP = lambda c_CxT: _accumulate_over_samples(  # noqa: E731
            lambda s, c: products(s)[1](c), sigma_CxTxN, c_CxT, chunk)

    return from_products(
        dense,
        lambda v: centred(jvp_CxT(v), w_CxT).astype(out_dtype).reshape(n_samples),
        lambda c: chain_sum(transpose_CxP(_centred_cotangent(c.reshape(C, T), w_CxT).astype(out_dtype))),
        out_dtype, n_samples, mode, n_chains=C, chunks=_sample_chunks(problem, params, sigma_CxTxN, mode, w_CxT),
    )


def parameter_blocks(params, size: int):
    """Leaves of the parameter tree grouped into blocks of at most `size` numbers each, [(i, j)]
    (leaves i .. j - 1, in `ravel_pytree`'s order): consecutive leaves while they fit; a leaf
    larger than `size` is a block of its own."""
    leaves = jax.tree_util.tree_leaves(params)
    blocks, start, filled = [], 0, 0
    for k, leaf in enumerate(leaves):
        if k > start and filled + leaf.size > size:
            blocks.append((start, k))
            start, filled = k, 0
        filled += leaf.size
    return [*blocks, (start, len(leaves))]


def _sample_chunks(problem: Problem, params, sigma_CxTxN, mode, w_CxT=None, block=None) -> SampleChunks:
    """Obar in chunks of `chunk_per_chain` samples of every chain (one chunk without
    chunk_size), for minSR's kernel: O of a chunk is made when it is asked for, centred with
    the mean over all samples (weighted by w if given), which `start` computes in a first
    pass over the chunks. `by_parameters(size)` gives the same chunks' columns for each block
    of leaves of at most `size` numbers (`parameter_blocks`), each made by derivatives with
    respect to its block alone (`block`: the leaves of this one, None for all)."""
    C, T = sigma_CxTxN.shape[:2]
    n_samples = C * T
    derivatives = _per_sample_derivatives(problem, params, mode, sigma_CxTxN[0, 0], block)
    chunk = problem.chunk_per_chain

    def blocks(size):
        return [_sample_chunks(problem, params, sigma_CxTxN, mode, w_CxT, b) for b in parameter_blocks(params, size)]

    by_parameters = blocks if block is None else None  # a block is not split again

    if chunk is None or chunk >= T:
        # O is whole anyway; the kernel still takes it in up to 4 chunks: its lower blocks are
        # then copies of the upper ones (5/8 of the products), and under a mesh one quarter of
        # O at a time is gathered onto every device.
        n = next(m for m in (4, 2, 1) if T % m == 0)

        def start():
            Obar_CxTxP = centred(derivatives(sigma_CxTxN), w_CxT)
            return lambda k: jax.lax.dynamic_slice_in_dim(Obar_CxTxP, k * (T // n), T // n, axis=1)

        return SampleChunks(n, start, by_parameters)

    if w_CxT is None:
        def start():
            sum_CxP = _accumulate_over_samples(lambda s, _: jnp.sum(derivatives(s), axis=1), sigma_CxTxN,
                                               jnp.zeros((C, T)), chunk)
            mean_P = chain_sum(sum_CxP) / n_samples
            return lambda k: (derivatives(jax.lax.dynamic_slice_in_dim(sigma_CxTxN, k * chunk, chunk, axis=1))
                              - mean_P) / jnp.sqrt(n_samples)

        return SampleChunks(T // chunk, start, by_parameters)

    def weighted_start():
        mean_P = chain_sum(_accumulate_over_samples(lambda s, w: weighted_chain_sums(derivatives(s), w), sigma_CxTxN,
                                                    w_CxT, chunk))
        return lambda k: _root_weighted(derivatives(jax.lax.dynamic_slice_in_dim(sigma_CxTxN, k * chunk, chunk, axis=1)),
                                        jax.lax.dynamic_slice_in_dim(w_CxT, k * chunk, chunk, axis=1), mean_P)

    return SampleChunks(T // chunk, weighted_start, by_parameters)


def energy_and_update(problem: Problem, params, sigma_CxTxN, solver, step=0, w_CxT=None):
    """Statistics of E_loc, the preconditioned gradient as a parameter pytree, the
    preconditioner's next state (`solver`: its state from the previous step) and its info
    (a dict of scalars for the metrics: CG's iterations and residual; {} for direct solvers).
    `step`: the VMC step, which a diag_shift schedule reads. `w_CxT`: the weights `draw` gives
    (a full sum's, or importance weights), None for samples of |psi|^2.

    Gradient convention (NetKet 3.23's, so learning rates transfer): dE/dtheta = 2 Re<O* (E_loc - E)>
    for real parameters; dE/dx + i dE/dy = 2 <O* (E_loc - E)> for complex z = x + i y, so a
    complex parameter moves exactly as the pair (x, y) of real ones would.
    """
    eloc_CxT = local_energies(problem, params, sigma_CxTxN)
    stats = statistics(eloc_CxT, w_CxT, exact=sums_exactly(problem))
    mode = gradient_mode(params, problem.model)
    jac = jacobian(problem, params, sigma_CxTxN, mode, w_CxT)
    if problem.clip_local_energy is None:
        eps_S = centred(eloc_CxT, w_CxT).reshape(-1)
    else:
        # A sample beside a near-node of psi (|psi(s)| << |psi(s')|) has a huge E_loc: rare,
        # but one such sample's gradient can throw the parameters far away.
        eps_S = centred(clip_outliers(eloc_CxT, problem.clip_local_energy), w_CxT).reshape(-1)
    solution_P, solver, info = problem.precondition.update(jac, eps_S, "real" if mode == "split" else mode, solver,
                                                           step)
    flat, unravel = ravel_pytree(params)
    # In split coordinates the solution is (dE/dx, dE/dy); the update is dE/dx + i dE/dy.
    update_P = from_split(solution_P) if mode == "split" else solution_P
    return stats, unravel(update_P.astype(flat.dtype)), solver, info


def sums_exactly(problem: Problem) -> bool:
    """Whether the problem's weights are a full sum's (exact), not importance weights."""
    return isinstance(problem.sampler, FullSumSampler)


def draw(problem: Problem, params, chains: ChainState):
    """(chains, sigma [C, T, N], w [C, T] or None, acceptance) for a training step: samples of
    |psi|^2 (w None); samples of |psi|^p with their importance weights |psi|^(2-p) for a
    sampler's `machine_pow` p != 2 (the rare configurations where |psi| is small, which the
    gradient needs to learn signs near nodes, are visited more); or a full sum's configurations
    and their exact weights."""
    power = training_power(problem.sampler)
    chains, sigma_CxTxN, acceptance = sample(problem.sampler, problem.amplitude, params, chains, power)
    if sums_exactly(problem):
        w_CxT = full_sum_weights(problem.sampler, problem.amplitude, params, sigma_CxTxN)
    elif power != 2.0:
        w_CxT = importance_weights(problem.sampler, problem.amplitude, params, sigma_CxTxN)
    else:
        w_CxT = None
    return chains, sigma_CxTxN, w_CxT, acceptance


def vmc_step(problem: Problem, state: VMCState, observe=None):
    """One VMC iteration: sample, estimate the energy and its gradient, update parameters.

    `observe`: optional (params, sigma_CxTxN, w_CxT, step) -> dict of scalars, measured on the
    step's own samples (with their importance weights, or None) and added to the metrics
    (`runner.core.observe.step_observer`).

    Returns:
        (new_state, metrics): metrics are replicated scalars describing the parameters
        *before* the update (the energy the samples estimate), the preconditioner's info
        (`cg_iters`, `cg_residual` when SR solves with CG) and, with importance weights, the
        effective sample fraction `ess_fraction` (`runner.core.stats.effective_sample_fraction`).
    """
    chains, sigma_CxTxN, w_CxT, acceptance = draw(problem, state.params, state.chains)
    stats, grads, solver, info = energy_and_update(problem, state.params, sigma_CxTxN, state.solver, state.step,
                                                   w_CxT)
    if problem.learning_rate is not None:  # a schedule: the value this step's update uses, for the metrics
        info = {**info, "learning_rate": problem.learning_rate(schedule_step(state))}
    if w_CxT is not None and not sums_exactly(problem):
        info = {**info, "ess_fraction": effective_sample_fraction(w_CxT)}
    observed = observe(state.params, sigma_CxTxN, w_CxT, state.step) if observe is not None else {}
    if problem.reject_jump is not None:
        grads = jax.tree_util.tree_map(lambda g: g * state.guard.scale.astype(g.real.dtype), grads)
    updates, opt_state = problem.optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    new_state = VMCState(params, opt_state, chains, state.step + 1, solver, state.guard)
    if problem.reject_jump is not None:
        new_state, guarded = _guarded(problem.reject_jump, state, new_state, stats)
        info = {**info, **guarded}
    return new_state, {**_metrics(stats, acceptance), **info, **observed}


def _guarded(k, state: VMCState, new_state: VMCState, stats):
    """(the next state, metrics) with `Problem.reject_jump` = k. The step's samples come from
    state.params, which the last accepted step produced; if their energy estimate lies more than
    k combined error bars above that step's, or is not finite, state.params is rejected: the next state goes back
    to the parameters, optimizer and preconditioner states that step started from, and the
    next update is scaled by half (each accepted step doubles the factor again, up to 1). A
    jump of the energy is what a step that moved the state's weight onto configurations no
    sample had visited looks like: the sampled metric (and a trust region in it) cannot see
    such a step before it is taken.

    The step after a rejection measures the kept parameters again, from the chains where they
    are; it is never rejected, and its estimate becomes the reference: a jump there (or an
    estimate that is not finite, which then stops the run) is the
    samples finding something the kept state already had (a 6 x 6 run's chains found a
    configuration holding nearly all of |psi|^2 at E_loc = +60 only after the per-step
    estimates had said -71.6), which going further back would not mend. Every decision reads
    replicated statistics, so it is the same on every layout."""
    guard = state.guard
    energy, error = jnp.real(stats.mean).astype(guard.energy.dtype), stats.error_of_mean.astype(guard.error.dtype)
    remeasured = guard.scale < 1  # the last step was rejected: state.params is the kept state
    # an estimate that is not finite (energy, error bar or variance: what stops a run) is a jump too
    usable = jnp.isfinite(energy) & jnp.isfinite(error) & jnp.isfinite(stats.variance)
    jump = ~remeasured & (~usable | (energy - guard.energy > k * jnp.sqrt(error**2 + guard.error**2)))
    accepted = Guard(state.params, state.opt_state, state.solver, energy, error, jnp.minimum(1.0, 2.0 * guard.scale))
    rejected = guard._replace(scale=guard.scale / 2)
    pick = lambda a, b: jax.tree_util.tree_map(lambda x, y: jnp.where(jump, x, y), a, b)  # noqa: E731
    next_state = new_state._replace(params=pick(guard.params, new_state.params),
                                    opt_state=pick(guard.opt_state, new_state.opt_state),
                                    solver=pick(guard.solver, new_state.solver), guard=pick(rejected, accepted))
    return next_state, {"rejected": jump.astype(jnp.int32), "step_scale": guard.scale}


def schedule_counts(opt_state) -> list:
    """The counts of the optax schedules in an optimizer state (`optax.ScaleByScheduleState`, what
    `optax.sgd(learning_rate=schedule)` and its kin keep): the step each schedule reads next."""
    is_schedule = lambda x: isinstance(x, optax.ScaleByScheduleState)  # noqa: E731
    return [x.count for x in jax.tree_util.tree_leaves(opt_state, is_leaf=is_schedule) if is_schedule(x)]


def schedule_step(state: VMCState):
    """The step the learning-rate schedule reads at this state: its optimizer's one schedule count
    (behind the VMC step by two for each step `reject_jump` undid, which took the optimizer back),
    else the VMC step."""
    counts = schedule_counts(state.opt_state)
    return counts[0] if len(counts) == 1 else state.step


BURN_IN_SWEEPS = 16
"""Sweeps per chain an estimate discards first when its chains were sampling another distribution
than |psi|^2 of the parameters it estimates (`final_burn_in`, `runner.evaluate`)."""


def burn_in_sweeps(sampler, sweeps: int) -> int:
    """The sweeps `burn_in` runs when asked for `sweeps`: none for a sampler without Markov chains
    (exact draws, a full sum)."""
    return sweeps if isinstance(sampler, MetropolisSampler) else 0


def final_burn_in(sampler) -> int:
    """Sweeps a run's final estimate discards before its rounds: `BURN_IN_SWEEPS` after training on
    samples of |psi|^p, p != 2 (the chains then sample |psi|^p, and the estimate |psi|^2), else
    none (the chains already sample |psi|^2, of parameters one step older; or there are none)."""
    return burn_in_sweeps(sampler, BURN_IN_SWEEPS if training_power(sampler) != 2.0 else 0)


def burn_in(problem: Problem, state: VMCState, sweeps: int) -> VMCState:
    """`state` with its Markov chains advanced `sweeps` sweeps of |psi|^2 at `state.params`, the
    configurations discarded; unchanged for `sweeps` 0 or a sampler without chains (exact, full sum).

    On two 6 x 6 CNNs trained on samples of |psi| (machine_pow 1, 128 chains), the first 8 sweeps
    of |psi|^2 after the switch gave local energies 0.034 and 0.038 above those of sweeps 17-48 on
    average (12 switches each, about 2 error bars; the unweighted mean over the samples of |psi|
    is 1.4 and 1.9 above): a final estimate of 32 sweeps per chain started there reads about 0.01
    high."""
    sampler, sweeps = problem.sampler, burn_in_sweeps(problem.sampler, sweeps)
    if sweeps == 0:
        return state
    burn = dataclasses.replace(sampler, n_samples=sampler.n_chains, n_discard_per_chain=sweeps - 1)
    chains, _, _ = sample(burn, problem.amplitude, state.params, state.chains)
    return state._replace(chains=chains)


def estimate(problem: Problem, state: VMCState, n_rounds: int = 1):
    """Energy statistics at the current parameters from fresh samples (no update).

    Draws `n_rounds` consecutive rounds of `n_samples` from |psi|^2 (whatever the sampler's
    `machine_pow` for training); each chain's rounds are treated as one longer chain, so the
    error and tau account for correlations between rounds. A full sum is summed once (more
    rounds would repeat it).

    Returns:
        (chains, metrics) with the advanced chains.
    """
    if sums_exactly(problem):
        chains, sigma_CxTxN, w_CxT, acceptance = draw(problem, state.params, state.chains)
        return chains, _metrics(statistics(local_energies(problem, state.params, sigma_CxTxN), w_CxT, exact=True),
                                acceptance)

    def one_round(chains, _):
        chains, sigma_CxTxN, acceptance = sample(problem.sampler, problem.amplitude, state.params, chains)
        return chains, (local_energies(problem, state.params, sigma_CxTxN), acceptance,
                        log_abs_max(problem, state.params, sigma_CxTxN))

    chains, (eloc_RxCxT, acceptance_R, log_abs_RxC) = jax.lax.scan(one_round, state.chains, length=n_rounds)
    eloc_CxRT = jnp.moveaxis(eloc_RxCxT, 0, 1).reshape(eloc_RxCxT.shape[1], -1)
    return chains, {**_metrics(statistics(eloc_CxRT), jnp.mean(acceptance_R)),
                    "log_abs_max": chain_max(jnp.moveaxis(log_abs_RxC, 0, 1))}


def log_abs_max(problem: Problem, params, sigma_CxTxN):
    """The largest log|psi| of each chain's samples, [C] (for `runner.diagnostics.peaks.check`: what the
    samples of an estimate reached)."""
    fn = lambda sigma: jnp.real(problem.logpsi(params, sigma))  # noqa: E731
    return jnp.max(map_over_samples(fn, sigma_CxTxN, problem.chunk_per_chain), axis=1)


def full_sum_invariance_error(problem: Problem, params_list) -> str | None:
    """Why a full sum over orbits (`runner.core.sampler.full_sum` with a symmetry) would be wrong for
    this model, or None: for each of the given parameter sets, |psi| and the log-derivatives O
    must be the same on every symmetry image of a few of the summed configurations (so psi,
    E_loc and O are constant on each orbit, up to a parameter-independent phase: a momentum or
    parity sector). H's invariance is checked when the run is built (`runner.config.build`). Evaluates
    the model: call it after the runtime is set up."""
    sampler = problem.sampler
    if not isinstance(sampler, FullSumSampler) or sampler.symmetry == "none":
        return None
    group_GxN = symmetry_group(sampler.hilbert, sampler.symmetry)
    N = sampler.hilbert.n_sites
    reps_KxN = sampler.sigma_CxTxN.reshape(-1, N)[: sampler.n_configurations]
    reps_KxN = reps_KxN[np.linspace(0, len(reps_KxN) - 1, min(8, len(reps_KxN))).astype(int)]
    images_KxGxN = jnp.asarray(reps_KxN[:, group_GxN])

    @jax.jit
    def deviations(params):  # of log |psi| and of O from their values on the representatives
        log_abs_KxG = jnp.real(problem.logpsi(params, images_KxGxN))
        O_KxGxP = log_derivatives(dataclasses.replace(problem, chunk_size=None), params, images_KxGxN,
                                  gradient_mode(params, problem.model))
        abs_off = jnp.max(jnp.abs(log_abs_KxG - log_abs_KxG[:, :1]) / (1.0 + jnp.abs(log_abs_KxG[:, :1])))
        O_off = jnp.max(jnp.abs(O_KxGxP - O_KxGxP[:, :1])) / (1.0 + jnp.max(jnp.abs(O_KxGxP)))
        return abs_off, O_off

    for params in params_list:
        abs_off, O_off = deviations(params)
        tol = float(np.sqrt(jnp.finfo(abs_off.dtype).eps))
        if not (abs_off <= tol and O_off <= tol):
            return (f"{sampler.symmetry} needs a model invariant under the group, and this one is not (|psi| or "
                    f"its derivatives change on symmetry images by up to {max(float(abs_off), float(O_off)):.1e}); "
                    f"use rbm_symm with that group, a model with symmetries={sampler.symmetry}, or "
                    "sampler.symmetry=none")
    return None


def _metrics(stats, acceptance):
    return {
        "energy": jnp.real(stats.mean),
        "energy_imag": jnp.imag(stats.mean),
        "energy_error": stats.error_of_mean,
        "variance": stats.variance,
        "r_hat": stats.r_hat,
        "tau_corr": stats.tau_corr,
        "acceptance": acceptance,
    }
