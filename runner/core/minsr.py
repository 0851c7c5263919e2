"""Sample-space SR (minSR) and SPRING, for more parameters than samples.

x = A^H (A A^H + diag_shift)^-1 b, through the identity (A^H A + l)^-1 A^H = A^H (A A^H + l)^-1,
with the kernel A A^H built chunk by chunk of samples (and block by block of parameters).
Conventions: `runner.core.precond_types`.
"""

import functools

import jax
import jax.numpy as jnp

from runner.core.diag_scale import chunks_of, inverse, metric_diagonal, relative_shift, scaled_columns
from runner.core.precond_types import Jacobian, SampleChunks
from runner.core.sr import _capped, _real_dot, _shifted, _solve_psd
from runner.parallel.mesh import replicated, spread_over_chains


def parameter_kernel(chunks: SampleChunks, mode, param_chunk_size=None, after=None):
    """`sample_kernel`, or with `param_chunk_size` the sum of the kernels of the chunks'
    parameter blocks (`SampleChunks.by_parameters`), one block after another in a fixed order:
    what is held is a block's columns of two chunks, not all P. Chunks that offer no blocks (a
    dense Jacobian's, whole anyway) give their kernel whole. `after`: as in `sample_kernel`."""
    if param_chunk_size is None or chunks.by_parameters is None:
        return sample_kernel(chunks, mode, after)
    blocks = chunks.by_parameters(param_chunk_size)
    kernels = [functools.partial(sample_kernel, block, mode, after) for block in blocks]
    if len(kernels) == 1:
        return kernels[0]()
    # One block per iteration of a loop (a branch of a switch each): the blocks' buffers are
    # never live together, as they could be in straight-line code.
    return jax.lax.fori_loop(1, len(kernels), lambda j, T: T + jax.lax.switch(j, kernels), kernels[0]())


def _after(x, y):
    """x, made to depend on y (x + 0 y[0], which XLA does not fold: 0 NaN is NaN).

    XLA:CPU runs independent operations concurrently, each device in its own order: a
    collective inside a loop (the kernel's chunk gathers) and an independent one outside it
    (the gather of the right-hand side for the solve) then ran in opposite orders on two
    devices, each waiting for the other forever (the 6 x 6 ViT's step on two virtual devices,
    docs/notes/benchmarks.md). Gathering y first and starting the loop from x orders them."""
    if y is None:
        return x
    first = jnp.real(jnp.ravel(y)[0]).astype(jnp.real(x).dtype)
    return x + jnp.zeros((), first.dtype) * first


def _kernel_rows(Obar_CxtxP, mode):
    """A chunk's rows of the sample-space problem's matrix A (A^H A = S), chain-major [C G t, P]:
    in mode "real" with a complex log psi each chain's real parts, then its imaginary parts
    (G = 2: the real problem with twice the samples); else Obar's rows as they are (G = 1)."""
    if mode == "real" and jnp.iscomplexobj(Obar_CxtxP):
        Obar_CxtxP = jnp.stack([jnp.real(Obar_CxtxP), jnp.imag(Obar_CxtxP)], axis=1)
    return Obar_CxtxP.reshape(-1, Obar_CxtxP.shape[-1])


def _kernel_block(R_axP, R_bxP):
    """R_a R_b^H [a, b]: complex blocks from four real products (faster than XLA's complex
    product on CPU). Each product has R_b's rows as its columns, whole on every device: XLA's
    CPU products give the same bits for any split of the rows of R_a (not for a split of the
    columns), which makes the kernel the same on every layout."""
    if not jnp.iscomplexobj(R_axP):
        return R_axP @ R_bxP.T
    ar, ai, br, bi = jnp.real(R_axP), jnp.imag(R_axP), jnp.real(R_bxP), jnp.imag(R_bxP)
    return jax.lax.complex(ar @ br.T + ai @ bi.T, ai @ br.T - ar @ bi.T)


def sample_kernel(chunks: SampleChunks, mode, after=None):
    """minSR's kernel T = A A^H [Q, Q] (Q = G N_s; G as in `_kernel_rows`), built block by block
    from the chunks of Obar, in kernel order: chunk, chain, G, sample of the chunk.

    Two chunks are held at a time (with what making O takes: a few chunk_size x P, plus T):
    the outer loop makes chunk a once, the inner one makes each later chunk b again, and T's
    lower blocks are the conjugate transposes of the upper ones (n (n + 1) / 2 of the n^2 block
    products). Compiled under a mesh, each device makes the rows of its own chains, then chunk
    b alone is gathered onto every device (never the whole Obar) and each device multiplies its
    rows of a with it; T is gathered (replicated) for the solve. With `after` (an array), the
    kernel's gathers and loops start only once it is computed (`_after`), and so does a loop
    around the kernel (`parameter_kernel`'s over parameter blocks).
    """
    spread, whole = spread_over_chains, replicated
    rows = chunks.start()
    chunk_rows = lambda k: spread(_kernel_rows(rows(k), mode))  # noqa: E731
    if chunks.n == 1:
        R_QxP = _after(chunk_rows(0), after)
        return whole(_kernel_block(R_QxP, whole(R_QxP)))
    R_shape = jax.eval_shape(chunk_rows, 0)
    Q, dtype = R_shape.shape[0], R_shape.dtype
    T_nQxnQ = _after(whole(jnp.zeros((chunks.n, Q, chunks.n, Q), dtype)), after)

    def outer(a, T):
        R_a = chunk_rows(a)
        T = T.at[a, :, a].set(whole(_kernel_block(R_a, whole(R_a))))

        def inner(b, T):
            B_QxQ = whole(_kernel_block(R_a, whole(chunk_rows(b))))
            return T.at[a, :, b].set(B_QxQ).at[b, :, a].set(jnp.conj(B_QxQ.T))

        return jax.lax.fori_loop(a + 1, chunks.n, inner, T)

    T_nQxnQ = jax.lax.fori_loop(0, chunks.n, outer, T_nQxnQ)
    return T_nQxnQ.reshape(chunks.n * Q, chunks.n * Q)


def _kernel_order(shape, inverse=False):
    """Permutes sample vectors between the Jacobian's coordinates (G, chain, sample of the
    chain; `to_samples`) and `sample_kernel`'s (chunk, chain, G, sample of the chunk)."""
    n, C, G, t = shape
    if inverse:
        return lambda y: y.reshape(n, C, G, t).transpose(2, 1, 0, 3).reshape(-1)
    return lambda v: v.reshape(G, C, n, t).transpose(2, 1, 0, 3).reshape(-1)


def minsr_update(jac: Jacobian, eps_S, mode, state, *, diag_shift, solver, momentum=0.0, max_norm=None,
                 param_chunk_size=None, diag_scale=None):
    """minSR: the SR solution in sample space, x = A^H (A A^H + diag_shift)^-1 b, with the
    kernel A A^H built chunk by chunk (`sample_kernel`; with `param_chunk_size`, also block by
    block of parameters, `parameter_kernel`) and x = A^H y by the Jacobian's products
    (per-chain sums in a fixed order). Without momentum, x is capped to a length of
    `max_norm` in the metric S (`_capped`; None: no cap). With `diag_scale`, the shift is the
    diagonal Lambda = diag_shift + diag_scale diag(S): x = Lambda^-1 A^H (A Lambda^-1 A^H + 1)^-1 b
    (`runner.core.diag_scale`; diag(S) from one more pass over the chunks).

    With `momentum` mu > 0, SPRING (Goldshlager, Abrahamsen, Lin, J. Comput. Phys. 2024):
    x_k = A^+ (b - mu A x_{k-1}) + mu x_{k-1}, A^+ = A^H (A A^H + diag_shift + 1 1^T / N_s)^-1,
    `state` the previous x; the 1 1^T / N_s (one per real sample group) lifts the kernel's null
    direction of centred derivatives and changes nothing in exact arithmetic.

    Returns:
        (x [P], next state, info).
    """
    chunks = chunks_of(jac)
    b = jac.to_samples(eps_S)
    C, t, _ = jax.eval_shape(lambda: chunks.start()(0)).shape
    n_samples = C * t * chunks.n
    shape = (chunks.n, C, b.shape[0] // n_samples, t)
    to_kernel, from_kernel = _kernel_order(shape), _kernel_order(shape, inverse=True)
    b = b if not momentum else 2.0 * b - momentum * jac.matvec(state)
    shift, kernel_shift, out = diag_shift, diag_shift, lambda x: x  # noqa: E731
    if diag_scale is not None:
        shift = relative_shift(metric_diagonal(chunks), diag_shift, diag_scale)
        inverse_P, kernel_shift = inverse(shift), 1.0
        chunks, out = scaled_columns(chunks, jnp.sqrt(inverse_P)), lambda x: inverse_P.astype(x.real.dtype) * x
        b = _after(b, shift)  # diag(S)'s chain sums before the gathers below
    # The right-hand side whole on every device before the kernel's loops start (`_after`).
    b_Q = replicated(to_kernel(b))
    T_QxQ = _shifted(parameter_kernel(chunks, mode, param_chunk_size, after=b_Q), kernel_shift)
    if not momentum:
        y_Q = replicated(_solve_psd(T_QxQ, b_Q, solver))
        x = out(2.0 * jac.rmatvec(from_kernel(y_Q)))
        # x = 2 A^H y, F = 2 A^H b and (A A^H + shift) y = b give x^H F = 4 (|b|^2 - shift y^H b);
        # the dot products over samples on every device whole (the same bits on every layout).
        x, info = _capped(x, 4.0 * (_real_dot(b_Q, b_Q) - kernel_shift * _real_dot(y_Q, b_Q)), shift, max_norm)
        return x, state, info
    group_Q = jnp.broadcast_to(jnp.arange(shape[2])[:, None], shape).reshape(-1)
    ones_QxQ = (group_Q[:, None] == group_Q[None, :]).astype(T_QxQ.dtype) / n_samples
    x = out(jac.rmatvec(from_kernel(_solve_psd(T_QxQ + ones_QxQ, b_Q, solver)))) + momentum * state
    return x, x, {}
