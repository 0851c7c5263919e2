"""A diagonal shift relative to diag(S): SR's and minSR's solves with Lambda = diag_shift + diag_scale diag(S).

(S + Lambda) x = F with the diagonal Lambda_k = diag_shift + diag_scale S_kk: a parameter whose
log-derivative varies more (a weight shared by many units of a symmetric model) is damped in
proportion, and the shift follows the size of S (a state where S is tiny still moves). The dense
solvers add Lambda to S; conjugate gradients to their products with S; minSR rescales the columns
of Obar by Lambda^-1/2 and solves the sample-space problem with a shift of 1
((A^H A + Lambda)^-1 A^H = Lambda^-1 A^H (A Lambda^-1 A^H + 1)^-1). diag(S) below DIAG_FLOOR of its
largest entry counts as that floor (a derivative constant up to rounding gets no step of
1 / rounding). Conventions: `runner.core.precond_types`.
"""

import jax
import jax.numpy as jnp

from runner.core.precond_types import Jacobian, SampleChunks
from runner.core.stats import chain_sum
from runner.parallel.mesh import spread_over_chains

DIAG_FLOOR = 1e-10


def chunks_of(jac: Jacobian) -> SampleChunks:
    """The Jacobian's chunks, or its dense matrix as one chunk."""
    if jac.chunks is not None:
        return jac.chunks

    def start():
        Obar_PxS = jac.dense()
        rows_CxTxP = Obar_PxS.T.reshape(jac.n_chains, Obar_PxS.shape[1] // jac.n_chains, Obar_PxS.shape[0])
        return lambda k: rows_CxTxP

    return SampleChunks(1, start)


def _squares(x):
    """|x|^2 elementwise, real."""
    return jnp.real(x) ** 2 + jnp.imag(x) ** 2 if jnp.iscomplexobj(x) else x**2


def metric_diagonal(chunks: SampleChunks):
    """diag(S) [P] = sum over samples of |Obar|^2 (every mode), from the chunks one after
    another: each chain's sum on the device holding the chain, then the chains added in
    `chain_sum`'s fixed order (the same bits on every layout). One more pass over the chunks (their derivatives made again)."""
    rows = chunks.start()
    # Over a chunk's samples too in a fixed pairwise order: XLA's CPU reduction over them gave
    # other bits on 1 and 2 devices.
    per_chain = lambda k: chain_sum(jnp.moveaxis(_squares(spread_over_chains(rows(k))), 1, 0))  # noqa: E731
    sums_CxP = per_chain(0)
    if chunks.n > 1:
        sums_CxP = jax.lax.fori_loop(1, chunks.n, lambda k, acc: acc + per_chain(k), sums_CxP)
    return chain_sum(sums_CxP)


def relative_shift(diag_P, diag_shift, diag_scale):
    """Lambda [P] = diag_shift + diag_scale max(diag(S), DIAG_FLOOR max diag(S))."""
    floor = DIAG_FLOOR * jnp.max(diag_P)
    return diag_shift + diag_scale * jnp.maximum(diag_P, floor)


def inverse(shift_P):
    """1 / Lambda, 0 where Lambda is 0 (a parameter with no derivative and no shift: no step)."""
    positive = shift_P > 0
    return jnp.where(positive, 1.0 / jnp.where(positive, shift_P, 1.0), 0.0)


def scaled_columns(chunks: SampleChunks, w_P) -> SampleChunks:
    """The chunks with column k multiplied by w_P[k] (real), their parameter blocks too (the
    blocks are consecutive columns, in order)."""
    def start():
        rows = chunks.start()
        return lambda k: _times(rows(k), w_P)

    by_parameters = chunks.by_parameters
    if by_parameters is None:
        return chunks._replace(start=start)

    def blocks(size):
        out, low = [], 0
        for block in by_parameters(size):
            width = jax.eval_shape(lambda b=block: b.start()(0)).shape[-1]
            out.append(scaled_columns(block, w_P[low:low + width]))
            low += width
        assert low == w_P.shape[0], (low, w_P.shape)
        return out

    return chunks._replace(start=start, by_parameters=blocks)


def _times(rows, w_P):
    return rows * w_P.astype(jnp.finfo(rows.dtype).dtype)
