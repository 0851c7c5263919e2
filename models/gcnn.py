"""Group-convolutional network over the lattice's space group, projected onto a symmetry sector."""

import dataclasses
import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from models import symmetrize
from models.common import attached, check_param_dtype, log_cosh, normal, real_times
from runner.errors import ConfigError
from runner.physics import symmetry


@dataclasses.dataclass(frozen=True)
class GroupTables:
    """The space group as the GCNN reads it, in hashable tuples (flax clones the model).

    Elements are the distinct site permutations of `runner.physics.symmetry.space_group` (on a
    small torus two elements {R | t} may act alike; they are one element here), identity first.

    Attributes:
        n_sites: N.
        perms: G rows of N site indices: (g s)_i = s_{perms[g][i]}.
        product: G rows of G: product[g][h] = the element g h (site maps composed, h first:
            perms[gh] = perms[g][perms[h]]; on configurations (g h) s = h (g s)).
        inverse: G indices, g^-1.
        little: the sector's little group (indices into `perms`), identity first.
        chi: chi(g) of each element of `little` (complex).
        parity: the sector's spin-flip parity, or None.
        sector: the `Sector` these tables hold (None: the trivial one of the whole group).
        cells: the translations' grid (L_1, ..., L_d) when the group is every point operation
            times every translation, each a distinct element, so that a convolution is cyclic
            in the translations (`grid` set); () otherwise.
        grid: G positions p T + t of the elements on the [P, T] grid of point operation p and
            flat translation t (T = prod(cells)); () when `cells` is.
    """

    n_sites: int
    perms: tuple
    product: tuple
    inverse: tuple
    little: tuple
    chi: tuple
    parity: int | None
    sector: Any
    cells: tuple = ()
    grid: tuple = ()

    @property
    def n_elements(self) -> int:
        return len(self.perms)

    def perm_GxN(self) -> np.ndarray:
        return np.asarray(self.perms, np.int32).reshape(-1, self.n_sites)

    def conv_index_GxG(self) -> np.ndarray:
        """[h, g] the index of h^-1 g: the kernel entry that takes feature h to feature g."""
        product = np.asarray(self.product, np.int32)
        return product[np.asarray(self.inverse)]

    def weights_K(self) -> np.ndarray:
        """complex128 [K] the output's weights chi(g)* over `little` (K = |G_k|), then, with a
        parity, parity chi(g)* for the spin-flipped configurations."""
        w = np.conj(np.asarray(self.chi, np.complex128))
        return w if self.parity is None else np.concatenate([w, self.parity * w])


def group_tables(perm_ExN, elements, chi, parity=None, sector=None, *, op_E=None, shift_ExD=None,
                 cells=()) -> GroupTables:
    """GroupTables from a space group's rows [E, N] (duplicates allowed, row 0 the identity) and
    a sector's little group (indices into those rows) with its characters. With each row's point
    operation `op_E`, cell offset `shift_ExD` and the translations' grid `cells`
    (`runner.physics.symmetry.SpaceGroup`), the tables also hold the grid the convolutions run
    on by FFT (`GroupTables.grid`), when every row is a distinct element.

    Raises:
        ConfigError (sector): two elements that act alike carry different characters (no
            state of the lattice lies in the sector), or the rows are not closed under products.
    """
    perm_ExN = np.asarray(perm_ExN, np.int64)
    n = perm_ExN.shape[1]
    rows, index_E = np.unique(perm_ExN, axis=0, return_inverse=True)
    order = np.argsort([np.flatnonzero(index_E == r)[0] for r in range(len(rows))], kind="stable")
    perm_GxN = rows[order]  # in order of first occurrence: the identity first
    index_E = np.argsort(order)[index_E.reshape(-1)]
    lookup = {tuple(p): g for g, p in enumerate(perm_GxN.tolist())}
    try:
        product = [[lookup[tuple(pg[ph].tolist())] for ph in perm_GxN] for pg in perm_GxN]
        inverse = [lookup[tuple(np.argsort(pg).tolist())] for pg in perm_GxN]
    except KeyError:
        raise ConfigError("hilbert", "has a space group that is not closed under products") from None
    little, chi_of = [], {}
    for e, c in zip(np.asarray(elements).tolist(), np.asarray(chi, np.complex128).tolist()):
        g = int(index_E[e])
        if g in chi_of:
            if abs(chi_of[g] - c) > 1e-9:
                raise ConfigError("sector", "holds no state of this lattice: two symmetry elements act alike "
                                            "on its sites but carry different characters")
            continue
        chi_of[g] = c
        little.append(g)
    tables = GroupTables(n, tuple(tuple(int(i) for i in p) for p in perm_GxN.tolist()),
                         tuple(tuple(r) for r in product), tuple(inverse), tuple(little),
                         tuple(complex(chi_of[g]) for g in little), parity, sector)
    grid = _translation_grid(tables, index_E, op_E, shift_ExD, cells)
    return tables if grid is None else dataclasses.replace(tables, cells=tuple(int(c) for c in cells), grid=grid)


def _translation_grid(tables: GroupTables, index_E, op_E, shift_ExD, cells) -> tuple | None:
    """The elements' positions p T + t on the [P, T] grid, or None when the rows are not each a
    distinct element {R_p | t} of P x T, or when W(h^-1 g) is not a function of (p_h, p_g,
    t_g - t_h) (checked on the whole product table: then the convolution is cyclic in t)."""
    if op_E is None or len(index_E) != tables.n_elements or int(np.prod(cells, dtype=int)) < 2:
        return None
    cells = np.asarray(cells, int)
    n_cells = int(np.prod(cells))
    position = np.empty(tables.n_elements, int)
    position[index_E] = np.asarray(op_E) * n_cells + np.ravel_multi_index(
        tuple((np.asarray(shift_ExD) % cells).T), tuple(cells))
    if sorted(position.tolist()) != list(range(tables.n_elements)):
        return None
    op, cell = np.divmod(position, n_cells)
    offset = np.ravel_multi_index(tuple(((np.stack(np.unravel_index(cell[None, :], tuple(cells)))
                                          - np.stack(np.unravel_index(cell[:, None], tuple(cells))))
                                         % cells[:, None, None])), tuple(cells))  # [h, g]: t_g - t_h
    key = (op[:, None] * len(op) + op[None, :]) * n_cells + offset
    index_GxG = tables.conv_index_GxG()
    first = np.full(len(op) ** 2 * n_cells, -1)
    first[key.ravel()] = index_GxG.ravel()
    if not np.array_equal(first[key], index_GxG):
        return None
    return tuple(int(p) for p in position)


def tables_of(hilbert, sector) -> tuple:
    """(GroupTables, Sector or None) for the runner's Hilbert space and a sector: null (the
    trivial character of the whole space group), a spec {momentum, irrep, parity} or a
    `runner.physics.symmetry.Sector`. Idempotent: tables already built are checked and kept."""
    if isinstance(hilbert, GroupTables):
        if sector != hilbert.sector:
            raise ConfigError("sector", f"differs from the one the group tables were built for ({hilbert.sector}); "
                                        "build the model from the Hilbert space")
        return hilbert, sector
    if hilbert is None:
        raise ConfigError("hilbert", "is required: this model is built on the lattice (the runner passes it)")
    group = symmetry.space_group(hilbert)
    if len(np.unique(group.perm_ExN, axis=0)) < 2:
        raise ConfigError("hilbert", "has no space group beyond the identity (a graph, or a lattice this small): "
                                     "the GCNN needs one")
    if sector == "auto":
        raise ConfigError("sector", "auto is resolved by the config builder; give null or "
                                    "{momentum: [...], irrep: ..., parity: ...} when building the model directly")
    if not isinstance(sector, symmetry.Sector):
        sector = symmetry.parse_sector(sector, hilbert, key="sector", group=group)
    grid = {"op_E": group.op_E, "shift_ExD": group.shift_ExD, "cells": group.extents}
    if sector is None:
        return group_tables(group.perm_ExN, np.arange(len(group.perm_ExN)), np.ones(len(group.perm_ExN)),
                            **grid), None
    try:
        symmetry.check_fits(hilbert, sector)
        elements, chi = symmetry.characters(group, sector)
    except ValueError as err:
        raise ConfigError("sector", f"does not fit this lattice: {err}") from None
    return group_tables(group.perm_ExN, elements, chi, sector.parity, sector, **grid), sector


@functools.lru_cache(maxsize=16)
def _index_tables(tables: GroupTables) -> tuple:
    """(inverse_GxN, conv_index_GxG) on the host, once per group: [g, j] the site perm_g^-1(j),
    and [h, g] the element h^-1 g."""
    return np.argsort(tables.perm_GxN(), axis=1).astype(np.int32), tables.conv_index_GxG()


# One jitted function: run eagerly (tests, exact sums) it compiles once per shape instead of op
# by op; inside a traced program it is inlined, with the group's index tables as host constants
# that only gather parameters (nothing for XLA to constant-fold).
@functools.partial(jax.jit, static_argnames=("tables", "elements"), inline=True)
def _features(params, sigma_BxN, tables: GroupTables, elements):
    """The last layer's features [B, G', C] (G' the `elements`, None: all) of the layers whose
    parameters (kernel0, bias0, kernels, biases) are given (`GCNN.features_xGxC`)."""
    kernel0, bias0, kernels, biases = params
    n, n_elements = tables.n_sites, tables.n_elements
    inverse_GxN, index_GxG = _index_tables(tables)
    out = np.arange(n_elements) if elements is None else np.asarray(elements, np.int32)
    # f1_c(g) = sum_i W_ci s_{perm_g(i)} = sum_j s_j W_c,perm_g^-1(j): one product with W
    # expanded to [N, G C].
    inverse_GxN = inverse_GxN[out] if not kernels else inverse_GxN
    expanded_NxGC = kernel0[inverse_GxN.T].reshape(n, -1)
    f = real_times(sigma_BxN.astype(jnp.real(kernel0).dtype), expanded_NxGC)
    f = f.reshape(f.shape[0], len(inverse_GxN), -1) + bias0
    for layer, (kernel, bias) in enumerate(zip(kernels, biases), start=1):
        elements_out = out if layer == len(kernels) else np.arange(n_elements)
        if tables.grid:
            f = _convolve_by_fft(log_cosh(f), kernel, tables, index_GxG, elements_out) + bias
            continue
        # The convolution as one product of x [B, C_in G] with the [C_in G, G' C_out] matrix of
        # W(h^-1 g), gathered along the kernel's group axis (no transpose of the matrix).
        columns = index_GxG[:, elements_out]
        matrix = jnp.take(jnp.swapaxes(kernel, 0, 1), columns, axis=1).reshape(n_elements * kernel.shape[1], -1)
        x = jnp.swapaxes(log_cosh(f), 1, 2).reshape(f.shape[0], -1)
        f = (x @ matrix).reshape(f.shape[0], columns.shape[1], -1) + bias
    return f


def _convolve_by_fft(x_BxGxC, kernel_GxCxC, tables: GroupTables, index_GxG, elements_out):
    """f_c'(g) = sum_{h, c} W_cc'(h^-1 g) x_c(h) at `elements_out` [B, G', C'], by FFT over the
    translations: with h = (p_h, t_h) and g = (p_g, t_g) on the tables' grid, W(h^-1 g) is a
    function of (p_h, p_g, t_g - t_h), so for each pair of point operations the sum over t_h is
    a cyclic convolution, a product per momentum: T products of [B, P C] x [P C, P C'] instead of
    one [B, G C] x [G C, G' C'] (G = P T)."""
    cells, (batch, n_elements, c_in), c_out = tables.cells, x_BxGxC.shape, kernel_GxCxC.shape[2]
    n_cells = math.prod(cells)
    n_ops, axes = n_elements // n_cells, tuple(range(2, 2 + len(cells)))
    position = np.asarray(tables.grid)
    order_PxT = np.argsort(position).reshape(n_ops, n_cells)  # the element at each grid point
    kernel_index = index_GxG[order_PxT[:, 0][:, None, None], order_PxT[None]]  # [p_h, p_g, t_g] with t_h = 0
    x_grid = x_BxGxC[:, order_PxT.reshape(-1)].reshape(batch, n_ops, *cells, c_in)
    k_grid = kernel_GxCxC[kernel_index.reshape(n_ops, n_ops, *cells)]  # [P, P, *cells, C, C']
    real = not (jnp.iscomplexobj(x_grid) or jnp.iscomplexobj(k_grid))
    x_hat = (jnp.fft.rfftn if real else jnp.fft.fftn)(x_grid, axes=axes)
    k_hat = (jnp.fft.rfftn if real else jnp.fft.fftn)(k_grid, axes=axes)
    momenta = x_hat.shape[2:2 + len(cells)]
    n_momenta = math.prod(momenta)
    x_hat = jnp.transpose(x_hat.reshape(batch, n_ops, n_momenta, c_in), (2, 0, 1, 3)).reshape(n_momenta, batch, -1)
    k_hat = jnp.transpose(k_hat.reshape(n_ops, n_ops, n_momenta, c_in, c_out), (2, 0, 3, 1, 4))
    y_hat = jnp.matmul(x_hat, k_hat.reshape(n_momenta, n_ops * c_in, n_ops * c_out))
    y_hat = jnp.transpose(y_hat.reshape(n_momenta, batch, n_ops, c_out), (1, 2, 0, 3)).reshape(
        batch, n_ops, *momenta, c_out)
    y = jnp.fft.irfftn(y_hat, s=cells, axes=axes) if real else jnp.fft.ifftn(y_hat, axes=axes)
    return y.reshape(batch, n_elements, c_out)[:, position[np.asarray(elements_out)]]


def check_features(features) -> tuple:
    """`features` as a tuple of positive integers, else ConfigError."""
    if (not isinstance(features, (list, tuple)) or not features
            or any(isinstance(f, bool) or not isinstance(f, int) or f < 1 for f in features)):
        raise ConfigError("features", f"must be a non-empty list of positive integers, one per layer (got {features!r})")
    return tuple(features)


READOUT_GAIN = 10.0  # log psi then spreads by about 0.1 over random configurations, at any N


class GCNN(nn.Module):
    """Group-convolutional network (Roth, Szabo, MacDonald, PRB 108, 054410 (2023)).

    Features are functions on the space group G. The embedding lifts the spins to the group,
    f1_c(g) = b_c + sum_i W_ci (g s)_i; each further layer is a group convolution
    f_c'(g) = b_c' + sum_{h, c} W_cc'(h^-1 g) x_c(h), x = log_cosh(f) of the layer before. Every
    layer is equivariant: f(h s)(g) = f(s)(h g). The last layer's log_cosh features are read out
    per element, phi(g) = sum_c a_c log_cosh(f_c(g)), and projected onto the sector:
    psi(s) = sum_{g in G_k} chi(g)* exp(phi_s(g)) (plus parity times the same on -s), so
    psi(h s) = chi(h) psi(s) on the little group G_k and psi(-s) = parity psi(s). Sector null:
    chi = 1 on the whole space group (a fully symmetric state), no spin-flip projection.
    """

    features: tuple = (8, 8)
    """Features per layer: the embedding's, then one per group convolution (n_layers = length)."""
    sector: Any = None
    """Symmetry sector of psi: null (trivial over the whole space group), a spec {momentum: [m1, m2],
    irrep: B1, parity: 1} (parity optional), or a `runner.physics.symmetry.Sector`."""
    param_dtype: Any = jnp.float64
    """Parameter dtype; complex dtypes give a complex (holomorphic) wavefunction."""
    hilbert: Any = None
    """The lattice (given by the runner); held as the space group's `GroupTables`."""

    holomorphic = True  # log psi is holomorphic in complex parameters (not a field)

    def __post_init__(self):
        object.__setattr__(self, "features", check_features(self.features))
        check_param_dtype(self.param_dtype)
        tables, sector = tables_of(self.hilbert, self.sector)
        object.__setattr__(self, "hilbert", tables)
        object.__setattr__(self, "sector", sector)
        super().__post_init__()

    def setup(self):
        tables, features = self.hilbert, self.features
        n, n_elements = tables.n_sites, tables.n_elements
        self.kernel0 = self.param("kernel0", normal(1 / math.sqrt(n)), (n, features[0]), self.param_dtype)
        self.bias0 = self.param("bias0", normal(0.01), (features[0],), self.param_dtype)
        kernels, biases = [], []
        for layer in range(1, len(features)):
            gain = 1.0 / math.sqrt(n_elements * features[layer - 1])
            kernels.append(self.param(f"kernel{layer}", normal(gain), (n_elements, features[layer - 1], features[layer]),
                                      self.param_dtype))
            biases.append(self.param(f"bias{layer}", normal(0.01), (features[layer],), self.param_dtype))
        self.kernels, self.biases = kernels, biases
        # Every layer at unit gain and the readout at READOUT_GAIN: psi averages exp(phi(g)) over the
        # little group, which keeps only the invariant part of phi, a few per cent of its spread, so
        # smaller gains (0.1 on the last convolution and the readout: log_cosh squares the first
        # one) started at the flat state, in S^z = 0 the ferromagnet, an eigenstate of the
        # Heisenberg model (docs/notes/starts.md).
        self.readout = self.param("readout", normal(READOUT_GAIN / math.sqrt(features[-1])), (features[-1],),
                                  self.param_dtype)

    def plus_x(self, params):
        """The parameters of the uniform state from those of an initialisation: feature c of the
        first layer sees site c mod N alone (`models.common.attached`) with zero bias, so every
        layer's input is the same on every configuration, and the log-derivatives in the first
        kernel, sums over the group of s_g(c) s_g(k) times the later layers' (equivariant, hence
        element-independent) sensitivity, hold every symmetric two-body term."""
        return {**params, "kernel0": attached(params["kernel0"]), "bias0": jnp.zeros_like(params["bias0"])}

    def features_xGxC(self, sigma_xN, n_layers: int | None = None, elements=None):
        """The features f of layer `n_layers` (1 to len(features), default the last), before
        log_cosh, at `elements` (indices into the group, default all) [..., G, C]."""
        last = len(self.features) if n_layers is None else n_layers
        out = None if elements is None else tuple(int(g) for g in np.asarray(elements).reshape(-1))
        params = (self.kernel0, self.bias0, tuple(self.kernels[:last - 1]), tuple(self.biases[:last - 1]))
        f = _features(params, sigma_xN.reshape(-1, self.hilbert.n_sites), self.hilbert, out)
        return f.reshape(*sigma_xN.shape[:-1], *f.shape[1:])

    def __call__(self, sigma_xN):
        tables = self.hilbert
        if tables.parity is not None:
            sigma_xN = jnp.stack([sigma_xN, -sigma_xN], axis=-2)  # [..., 2, N]
        # Only the little group's features enter psi: the last layer computes those alone.
        phi_xK = log_cosh(self.features_xGxC(sigma_xN, elements=tables.little)) @ self.readout
        if tables.parity is not None:
            phi_xK = phi_xK.reshape(*phi_xK.shape[:-2], -1)  # [..., 2 K]: s first, then -s
        return symmetrize.log_weighted_sum(phi_xK, tables.weights_K())
