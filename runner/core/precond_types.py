"""What every preconditioner takes: Obar as a `Jacobian` (and its `SampleChunks`), and the force.

Obar and eps are the centred, scaled log-derivatives and local energies

    Obar_PxS = (O - <O>)^T / sqrt(N_s),   eps_S = (E_loc - <E>) / sqrt(N_s)

given as a `Jacobian` (the dense matrix on demand, parameters first: XLA's CPU matrix product is
about twice as fast with the contraction on the trailing axis of both operands; or products
with vectors, O never formed) with the gradient mode:

- mode "real" (real parameters): gradient F = 2 Re(conj(Obar) eps) = dE/dtheta, metric
  S = Re(conj(Obar) Obar^T);
- mode "holomorphic" (complex parameters, holomorphic log psi): F = 2 conj(Obar) eps =
  dE/dx + i dE/dy for z = x + i y (twice dE/dconj(z)), S = conj(Obar) Obar^T.

The complex convention is NetKet's (3.23, `force_to_grad`): a complex parameter moves exactly
as the pair of real parameters (x, y) would, so learning rates mean the same for both.
"""

from typing import Callable, NamedTuple

import jax.numpy as jnp


class Jacobian(NamedTuple):
    """Obar (see the module docstring) of one batch of samples.

    dense: () -> Obar_PxS, materialised (only when a preconditioner calls it); its samples are
        n_chains chains of N_s / n_chains consecutive samples;
    matvec: v_P -> Obar v; rmatvec: w -> Obar^H w, without forming Obar. In mode "real" with
        a complex log psi both act on real sample vectors (Re; Im) of length 2 N_s;
    to_samples: eps_S -> eps in the coordinates of matvec's output;
    n_chains: the dense solvers sum over samples chain by chain in this fixed order, so their
        result does not depend on how the chains are spread over devices;
    chunks: Obar chunk by chunk for the sample-space solver (`SampleChunks`), or None (then
        it takes `dense` as one chunk).
    """

    dense: Callable
    matvec: Callable
    rmatvec: Callable
    to_samples: Callable
    n_chains: int = 1
    chunks: "SampleChunks | None" = None


class SampleChunks(NamedTuple):
    """Obar as n chunks of rows (samples first), each made when asked, for building minSR's
    sample-space kernel without holding all of Obar.

    n: the number of chunks; chunk k holds samples k t .. (k + 1) t - 1 of every chain;
    start: () -> rows, rows: k (an int, may be traced) -> chunk k of Obar^T, [C, t, P] (complex
        when log psi is, in every mode). `start` computes what every chunk needs (the mean of
        O over all samples) where it is called: call it once, outside any loop over chunks.
    by_parameters: size -> [SampleChunks], the same chunks split by columns into blocks of
        parameters (at most `size` each where the parameters allow; every column in exactly one
        block), each made without the others (None: not offered, use the chunks whole).
    """

    n: int
    start: Callable
    by_parameters: Callable | None = None


def from_products(dense, apply, apply_T, out_dtype, n_samples, mode, *, n_chains=1, chunks=None) -> Jacobian:
    """A Jacobian from a linear map v_P -> Obar v [N_s] (`apply`, of dtype `out_dtype`) and its
    linear transpose w -> Obar^T w (`apply_T`, no conjugation), in the conventions of `mode`."""
    if mode == "holomorphic":
        # Obar^H w = conj(Obar^T conj(w)).
        return Jacobian(dense, apply, lambda w: jnp.conj(apply_T(jnp.conj(w))), lambda e: e, n_chains, chunks)
    if not jnp.issubdtype(out_dtype, jnp.complexfloating):
        return Jacobian(dense, apply, lambda w: jnp.real(apply_T(w)), jnp.real, n_chains, chunks)
    # Real parameters, complex log psi: samples in real coordinates (Re; Im). For real v,
    # Re(Obar^T (w_re - i w_im)) = Re(Obar)^T w_re + Im(Obar)^T w_im.
    stack = lambda y: jnp.concatenate([jnp.real(y), jnp.imag(y)])  # noqa: E731
    return Jacobian(
        dense,
        lambda v: stack(apply(v)),
        lambda w: jnp.real(apply_T((w[:n_samples] - 1j * w[n_samples:]).astype(out_dtype))),
        lambda e: stack(e.astype(out_dtype)),
        n_chains,
        chunks,
    )


def from_dense(Obar_PxS, mode) -> Jacobian:
    """A Jacobian whose products use the given dense matrix (conventions as `Jacobian`)."""
    return from_products(lambda: Obar_PxS, lambda v: Obar_PxS.T @ v, lambda w: Obar_PxS @ w,
                         Obar_PxS.dtype, Obar_PxS.shape[1], mode)


def force(jac: Jacobian, eps_S, mode):
    """The energy gradient F in the convention of `mode` (see the module docstring)."""
    return 2.0 * jac.rmatvec(jac.to_samples(eps_S))
