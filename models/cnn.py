"""Residual convolutional network on the lattice's Bravais grid."""

import functools
import itertools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from models import symmetrize
from models.common import activation, attached, check_param_dtype, normal
from models.jastrow import by_displacement, displacement_table
from runner.errors import ConfigError, require_bool


def kernel_offsets(kernel_size: int, n_dims: int) -> np.ndarray:
    """[kernel_size^d, d] a kernel's offsets, -(k-1)//2 ... k//2 per direction, in the order of
    its rows."""
    return np.array(list(itertools.product(range(-((kernel_size - 1) // 2), kernel_size // 2 + 1),
                                           repeat=n_dims)))


def neighbour_table(shape: tuple, kernel_size: int, pbc: bool) -> np.ndarray:
    """[cells, kernel_size^d] the cell at each `kernel_offsets` offset from every cell, wrapped
    with pbc, else the padding index `cells`."""
    cells = np.stack(np.unravel_index(np.arange(math.prod(shape)), shape), axis=-1)  # [C, d]
    offsets = kernel_offsets(kernel_size, len(shape))  # [K, d]
    target = cells[:, None, :] + offsets[None, :, :]
    extent = np.asarray(shape)
    inside = np.all((target >= 0) & (target < extent), axis=-1)
    index = np.ravel_multi_index(tuple(np.moveaxis(target % extent, -1, 0)), shape)
    return np.where(inside | pbc, index, len(cells)).astype(np.int32)


# How `grid_conv` convolves real inputs (bench/cnn_conv.py times the three; docs/notes/benchmarks.md,
# "The CNN's convolution as products"): up to WINDOW_BATCH configurations per call (the sampler's
# proposals) every cell's window is stacked from slices of the padded grid and multiplied with the
# kernel once; more (local energies) as one product with the whole layer's matrix over all cells,
# while the lattice has at most DENSE_CELLS_PER_WINDOW cells per kernel window (that matrix does
# cells / K times the convolution's arithmetic, in a product XLA:CPU runs near its peak); larger
# lattices, and complex parameters (whose step the products made slower), through XLA's convolution.
WINDOW_BATCH = 64
DENSE_CELLS_PER_WINDOW = 12
FORMS = ("xla", "windows", "dense")


def conv_form(batch: int, cells: int, n_window: int, complex_params: bool = False) -> str:
    """The formulation `grid_conv` takes for `batch` configurations of a lattice of `cells`
    cells, kernels of `n_window` offsets, and real or complex parameters."""
    if complex_params:
        return "xla"
    if batch <= WINDOW_BATCH:
        return "windows"
    return "dense" if cells <= DENSE_CELLS_PER_WINDOW * n_window else "xla"


def padded(h, shape: tuple, kernel_size: int, pbc: bool):
    """h [..., *shape, C] padded by the kernel's reach on each side of each direction: wrapped
    around with pbc (more than once where the kernel is wider than the lattice), zeros without."""
    n = len(shape)
    widths = [((kernel_size - 1) // 2, kernel_size // 2)] * n
    return jnp.pad(h, [(0, 0)] * (h.ndim - n - 1) + widths + [(0, 0)], mode="wrap" if pbc else "constant")


def windows(h, shape: tuple, kernel_size: int, pbc: bool):
    """[..., *shape, K C_in]: every cell's kernel window of h [..., *shape, C_in], offsets in
    `kernel_offsets`' order (the cells of `neighbour_table`, zeros at its padding index), each a
    slice of the padded grid."""
    reach = (kernel_size - 1) // 2
    h_pad = padded(h, shape, kernel_size, pbc)
    return jnp.concatenate(
        [h_pad[(..., *(slice(reach + d, reach + d + e) for d, e in zip(offset, shape)), slice(None))]
         for offset in kernel_offsets(kernel_size, len(shape))], axis=-1)


def conv_matrix(kernel, shape: tuple, kernel_size: int, pbc: bool):
    """[cells C_in, cells C_out] the convolution with kernel [K C_in, C_out] as one linear map of
    the flattened grid (cell-major on both sides): block (s, d) is the sum of the kernel's rows
    at every offset that takes cell d to cell s (one, or none, unless the kernel wraps around)."""
    table = neighbour_table(shape, kernel_size, pbc)  # [cells, K]
    cells, n_window = table.shape
    hits = np.zeros((n_window, cells + 1, cells), np.float32)  # [offset, source, target]
    hits[np.arange(n_window)[None, :], table, np.arange(cells)[:, None]] = 1
    k = kernel.reshape(n_window, -1, kernel.shape[-1])
    matrix = jnp.einsum("jsd,jio->sido", jnp.asarray(hits[:, :cells], k.dtype), k)
    return matrix.reshape(cells * k.shape[1], cells * k.shape[2])


@functools.lru_cache(maxsize=None)
def grid_conv(shape: tuple, kernel_size: int, pbc: bool, form: str | None = None):
    """conv(h [..., *shape, C_in], kernel [K C_in, C_out]) -> [..., *shape, C_out], K = kernel_size^d,
    the kernel's rows in `neighbour_table`'s offset order, then input channel; wrapped around
    with pbc, zero padded without.

    `form` (None: by `conv_form`, from the configurations of each call as traced, vmap's axes not
    counted, and the parameters' kind): "windows" stacks every cell's window from slices of the
    padded grid and multiplies once; "dense" multiplies the flattened grid with `conv_matrix`;
    "xla" is XLA's convolution of the padded grid (the same sums, rounded differently). The
    derivative by the kernel is always the windows' product (XLA's kernel gradient, batched over
    samples for per-sample log-derivatives, becomes a grouped convolution 50x slower). complex64
    runs as one real convolution of stacked real and imaginary parts (2 C_in -> 2 C_out channels)."""
    n = len(shape)
    cells = math.prod(shape)
    numbers = ("N" + "HWD"[:n] + "C", "HWD"[:n] + "IO", "N" + "HWD"[:n] + "C")

    def real_conv(h, kernel, complex_params):
        lead = h.shape[:h.ndim - n - 1]
        chosen = form or conv_form(math.prod(lead), cells, kernel_size ** n, complex_params)
        if chosen == "windows":
            return windows(h, shape, kernel_size, pbc) @ kernel
        if chosen == "dense":
            y = h.reshape(*lead, cells * h.shape[-1]) @ conv_matrix(kernel, shape, kernel_size, pbc)
            return y.reshape(*lead, *shape, kernel.shape[-1])
        h_pad = padded(h, shape, kernel_size, pbc)
        y = jax.lax.conv_general_dilated(h_pad.reshape(-1, *h_pad.shape[len(lead):]),
                                         kernel.reshape(*(kernel_size,) * n, h.shape[-1], kernel.shape[-1]),
                                         (1,) * n, "VALID", dimension_numbers=numbers)
        return y.reshape(*lead, *shape, kernel.shape[-1])

    def stacked_conv(h, kernel):
        """real_conv, complex64 through stacked real parts: [Re y, Im y] = [Re h, Im h] conv
        [[Re k, Im k], [-Im k, Re k]]."""
        dtype = jnp.result_type(h, kernel)
        if dtype != jnp.complex64:
            return real_conv(h, kernel, jnp.issubdtype(dtype, jnp.complexfloating))
        h, kernel = h.astype(jnp.complex64), kernel.astype(jnp.complex64)
        c_in, c_out = h.shape[-1], kernel.shape[-1]
        k_re, k_im = (part.reshape(-1, 1, c_in, c_out) for part in (kernel.real, kernel.imag))
        stacked = jnp.concatenate([jnp.concatenate([k_re, k_im], axis=3), jnp.concatenate([-k_im, k_re], axis=3)],
                                  axis=2).reshape(-1, 2 * c_out)
        y = real_conv(jnp.concatenate([h.real, h.imag], axis=-1), stacked, True)
        return jax.lax.complex(y[..., :c_out], y[..., c_out:])

    @jax.custom_jvp
    def conv(h, kernel):
        return stacked_conv(h, kernel)

    def conv_jvp(primals, tangents):
        (h, kernel), (dh, dkernel) = primals, tangents
        terms = []
        if not isinstance(dh, SymbolicZero):
            terms.append(stacked_conv(dh, kernel))
        if not isinstance(dkernel, SymbolicZero):
            terms.append(windows(h, shape, kernel_size, pbc) @ dkernel)
        return stacked_conv(h, kernel), functools.reduce(jnp.add, terms)

    conv.defjvp(conv_jvp, symbolic_zeros=True)
    return conv


def with_bias_channel(kernel, bias, kernel_size: int, n_dims: int):
    """kernel [K C_in, C_out] for inputs with one more channel, constant 1: zero at every offset
    but the centre, `bias` there, so conv(concat[h, 1], kernel') = conv(h, kernel) + bias (the
    centre never reaches the padding)."""
    centre = np.all(kernel_offsets(kernel_size, n_dims) == 0, axis=-1)
    k = kernel.reshape(len(centre), -1, kernel.shape[-1])
    row = jnp.where(centre[:, None, None], bias.astype(kernel.dtype)[None, None, :], 0).astype(kernel.dtype)
    return jnp.concatenate([k, row], axis=1).reshape(-1, kernel.shape[-1])


class CNN(nn.Module):
    """Convolutions over the unit cells (the basis sites as input channels, `grid_conv`):
    a first layer, then depth - 1 residual layers x + conv(f(x)), and log psi = the sum
    over cells of a readout of f(x), f = log cosh (`models.common.log_cosh`). Periodic padding
    with pbc makes every layer commute with the lattice translations, so log psi is invariant
    under them. Square lattices convolve on the (Lx, Ly) grid, triangular ones on the same grid
    in oblique coordinates (their sites form a Bravais grid too), chains in 1D."""

    channels: int = 8
    """Channels of every convolution."""
    kernel_size: int = 3
    """Kernel extent in cells along each lattice direction."""
    depth: int = 2
    """Number of convolution layers (the first, plus depth - 1 residual ones)."""
    jastrow: bool = False
    """Multiply psi by a translation-invariant two-body Jastrow factor, exp(1/2 sum_{i != j} s_i
    J_ij s_j) with a coupling per basis site and displacement (`models.jastrow.by_displacement`;
    parameter `jastrow` [N, n_basis])."""
    sector: Any = None
    """The symmetry sector projected onto: None (no projection), a `runner.physics.symmetry.Sector`
    or {momentum, irrep, parity}; held as a `models.symmetrize.Projection`. With pbc log psi is
    invariant under the translations already: one image per coset of them, and k = 0 only."""
    param_dtype: Any = jnp.float64
    """Parameter dtype; complex dtypes give a complex (holomorphic) wavefunction."""
    hilbert: Any = None
    """The lattice (given by the runner); held as a `models.symmetrize.Lattice`."""

    holomorphic = True  # log psi is holomorphic in complex parameters (not a field)

    def __post_init__(self):
        require_bool("jastrow", self.jastrow)
        for key in ("channels", "kernel_size", "depth"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(key, f"must be a positive integer (got {value!r})")
        check_param_dtype(self.param_dtype)
        invariance = None
        if self.hilbert is not None and not isinstance(self.hilbert, symmetrize.Lattice):
            invariance = symmetrize.Invariance(
                symmetrize.translations_by(self.hilbert, 1), "the translations",
                "model=vit with a patch_size p that makes every m_a p / L_a an integer")
        object.__setattr__(self, "sector", symmetrize.projection_of(self.sector, self.hilbert, invariance))
        object.__setattr__(self, "hilbert", symmetrize.lattice_of(self.hilbert))
        super().__post_init__()

    def plus_x(self, params):
        """The parameters of the uniform state from those of an initialisation: each channel of the
        first convolution sees one site of its cell alone (the window's centre, basis site c mod
        n_basis: `models.common.attached`), every bias, the residual layers and the Jastrow factor
        zero, the readout kept. Then f(x) = log cosh(w s) is the same on every configuration, and
        the log-derivatives in the first kernel, readout_c tanh(w) sum over cells of s_cell
        s_(cell + offset), hold every translation-invariant two-body term within a window (the
        Jastrow's, at every displacement)."""
        n_dims = len(self.hilbert.shape)
        centre = np.all(kernel_offsets(self.kernel_size, n_dims) == 0, axis=-1)
        k = params["kernel0"].reshape(len(centre), -1, self.channels)
        k = jnp.where(centre[:, None, None], attached(k[0])[None], 0).astype(k.dtype)
        zeroed = {f"{kind}{layer}" for kind in ("kernel", "bias") for layer in range(1, self.depth)}
        zeroed |= {"bias0", "jastrow"}
        out = {name: jnp.zeros_like(v) if name in zeroed else v for name, v in params.items()}
        return {**out, "kernel0": k.reshape(params["kernel0"].shape)}

    @nn.compact
    def unprojected(self, sigma_xN):
        """log psi before the symmetry projection [...]."""
        lattice = self.hilbert
        n = len(lattice.shape)
        conv = grid_conv(lattice.shape, self.kernel_size, lattice.pbc)
        x = sigma_xN.reshape(*sigma_xN.shape[:-1], *lattice.shape, lattice.n_basis).astype(self.param_dtype)
        n_window = self.kernel_size ** n
        f, gain = activation("log_cosh")
        for layer in range(self.depth):
            h = x if layer == 0 else f(x)
            kernel = self.param(f"kernel{layer}", normal(gain / math.sqrt(n_window * h.shape[-1])),
                                (n_window * h.shape[-1], self.channels), self.param_dtype)
            bias = self.param(f"bias{layer}", normal(0.01), (self.channels,), self.param_dtype)
            if layer == 0:
                # The first layer's bias through a channel of ones, inside the convolution: added
                # after it, the bias and the convolution's output both entered the fusion that
                # computes the next layer's f, which XLA:CPU then compiled to much slower code than
                # for a single input (docs/notes/benchmarks.md). The later layers' input, the
                # residual sum, is stored once and read by that fusion alone.
                h = jnp.concatenate([h, jnp.ones_like(h[..., :1])], axis=-1)
                kernel = with_bias_channel(kernel, bias, self.kernel_size, n)
                y = conv(h, kernel)
            else:
                y = conv(h, kernel) + bias
            x = y if layer == 0 else x + y
        # A readout weight per channel, small at the start: log psi nearly flat, so the first
        # samples spread over the space instead of sitting on the few largest configurations.
        readout = self.param("readout", normal(0.1 / math.sqrt(self.channels)), (self.channels,), self.param_dtype)
        per_cell = f(x) @ readout
        log_psi = jnp.sum(per_cell.reshape(*per_cell.shape[:per_cell.ndim - n], -1), axis=-1)
        if not self.jastrow:
            return log_psi
        coupling = self.param("jastrow", normal(0.01), (lattice.n_sites, lattice.n_basis), self.param_dtype)
        table = displacement_table(lattice.shape, lattice.n_basis)
        return log_psi + by_displacement(sigma_xN.astype(self.param_dtype), coupling, table)

    def __call__(self, sigma_xN):
        return symmetrize.project(self.unprojected, sigma_xN, self.sector)
