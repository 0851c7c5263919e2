"""Log-derivatives of log psi over samples: O, and Obar as a `Jacobian` (products, dense, chunks).

Obar is O centred and scaled (`centred`); its chunks of samples and blocks of parameters feed
minSR's kernel (`runner.core.minsr`).
"""

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from models import fast_paths
from runner.core.local_energy import map_over_samples
from runner.core.precond_types import Jacobian, SampleChunks, from_products
from runner.core.problem import Problem
from runner.core.stats import chain_mean, chain_sum, weighted_chain_sums, weighted_mean
from runner.core.wavefunction import from_split, to_split


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
