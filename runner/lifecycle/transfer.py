"""Transfers (`init_from` across sizes and symmetries): which config differences a warm start may
cross, and the parameters of a run on a smaller torus, or of a less symmetric model of the same
family, mapped onto this config's model.

Rules (docs/models.md, "Transfer"):
- CNN: every parameter carries over as it is (kernels over kernel offsets and channels, biases,
  readout: none depends on the torus), but the Jastrow factor's kernel over sites [N, n_basis], by
  displacement (below).
- RBMSymm: the filter over sites [N, alpha] by displacement (below); the biases unchanged.
- GCNN: the embedding over sites [N, C] by displacement; each group kernel [G, C, C'] by group
  element: the entry of {R | t} on the small torus goes to {R | t'} on the larger one, the same
  point operation R and t' the shortest lattice vector equal to t on the small torus.
- ViT: the attention's positional bias [heads, P] by patch displacement; everything else (patch
  embedding, attention and feed-forward weights, output) unchanged.
Displacement: a site (or translation) of the small torus stands for every vector equal to it
modulo the small torus' periods; it is placed at the shortest of them (a site's position taken
from the point group's centre), split equally over ties (additive weights) or copied to each
(the ViT's bias, a logit). Entries with no source are zero. With those rules a configuration
tiled from a small-torus one gives the larger torus' layers the small torus' features, so with
sum pooling log psi grows by the number of copies (tests/lifecycle/test_transfer.py).
"""

import math

import numpy as np

from runner.config import fingerprint
from runner.errors import ConfigError
from runner.lifecycle.load import refuse_difference

# The torus' size: what a transfer may change in the hilbert group.
SIZE_KEYS = ("hilbert.L", "hilbert.Lx", "hilbert.Ly")
# The model's symmetry: what a transfer may change in the model group (less to more symmetric).
SYMMETRY_KEYS = ("model.group", "model.sector")
# rbm_symm's groups, each to the ones that contain it (a transfer goes up this order only).
GROUP_UP = {"translations": ("lattice",)}
# The models whose weights mean something on another torus (by `_target_`).
SIZE_MODELS = ("CNN", "GCNN", "RBMSymm", "ViT")
# Why the others' do not.
WHY_NOT = {"RBM": "hidden units tied to the N sites, with no translation structure",
           "Jastrow": "a weight per pair of sites", "MLP": "weights per site, with no translation structure"}


def value(flat: dict, key: str):
    """A key's value in a flattened config: a group's (a dict sector) gathered back, None when absent."""
    if key in flat:
        return flat[key]
    inner = {k[len(key) + 1:]: v for k, v in flat.items() if k.startswith(key + ".")}
    return inner or None


def changes(stored: dict, current: dict) -> tuple:
    """(size, symmetry): the size and symmetry keys whose value differs between two flattened
    configs (a source run's and this one's)."""
    def differing(keys):
        return tuple(k for k in keys if value(stored, k) != value(current, k))
    return differing(SIZE_KEYS), differing(SYMMETRY_KEYS)


def extents(flat: dict) -> tuple:
    """The torus' unit cells per direction a flattened config asks for ((L,) for a chain)."""
    if flat.get("hilbert._target_", "").endswith(".chain"):
        return (int(flat["hilbert.L"]),)
    lx, ly = flat.get("hilbert.Lx"), flat.get("hilbert.Ly")
    return (int(flat["hilbert.L"] if lx is None else lx), int(flat["hilbert.L"] if ly is None else ly))


def check(stored: dict, current: dict, where: str, chains: bool) -> None:
    """Raises ConfigError unless the differences between a source's config and this one are a
    transfer: another torus size of the same lattice (pbc, the same Sz density or total_sz 0,
    the same Hamiltonian) for a model in SIZE_MODELS, and/or a more symmetric model of the
    same family (rbm_symm's group up `GROUP_UP`, a sector where the source had none)."""
    size, symmetry = changes(stored, current)
    target = str(current.get("model._target_")).rsplit(".", 1)[-1]  # the class (a fingerprint may shorten it)
    if size:
        if target not in SIZE_MODELS:
            names = ", ".join(SIZE_MODELS)
            raise ConfigError(size[0], f"is {fingerprint.show(current.get(size[0]))} in this config but "
                              f"{fingerprint.show(stored.get(size[0]))} in {where}, and model {target} has "
                              f"{WHY_NOT.get(target, 'no rule mapping its weights')}: its weights cannot carry over to "
                              f"another lattice size (a transfer carries {names})")
        if not current.get("hilbert.pbc"):
            raise ConfigError("hilbert.pbc", f"is false, and a transfer from {where} to another size needs a torus")
        small, large = extents(stored), extents(current)
        if len(small) != len(large) or any(s > b for s, b in zip(small, large)):
            raise ConfigError(size[0], f"gives the torus {large}, smaller than {small} of {where}; a transfer "
                                       "goes to a torus at least as large in every direction")
        if chains:
            raise ConfigError("init_chains", f"is true, and {where} has another lattice size; a transfer takes "
                                             "the parameters only (init_chains=false)")
        total_old, total_new = stored.get("hilbert.total_sz"), current.get("hilbert.total_sz")
        same = (total_old == total_new == None or  # noqa: E711
                total_old is not None and total_new is not None
                and abs(total_old * math.prod(large) - total_new * math.prod(small)) < 1e-9)
        if not same:
            raise ConfigError("hilbert.total_sz", f"is {fingerprint.show(total_new)} in this config but "
                              f"{fingerprint.show(total_old)} in {where}; a transfer to another size keeps the "
                              "Sz per unit cell")
        refuse_difference(stored, current, ("hamiltonian.",), where, "a transfer to another size needs the same Hamiltonian")
    for key in symmetry:
        old, new = value(stored, key), value(current, key)
        up = new in GROUP_UP.get(old, ()) if key == "model.group" else old is None
        if not up:
            raise ConfigError(key, f"is {fingerprint.show(new)} in this config but {fingerprint.show(old)} in {where}; "
                              "a transfer goes from a less to a more symmetric model (model.group translations "
                              "to lattice, model.sector from null)")


def relaxed(stored: dict, current: dict) -> tuple:
    """The keys a warm start from `stored` ignores in its parameter check: those `check`
    examines (the size and symmetry keys that differ; with the size, hilbert.total_sz)."""
    size, symmetry = changes(stored, current)
    return (*size, *symmetry, *(("hilbert.total_sz",) if size else ()))


# --- the parameter maps ---------------------------------------------------------------------


def shortest(vector_D, periods_D, cell_vectors, offset=None) -> np.ndarray:
    """[m, d] the integer cell vectors equal to `vector_D` modulo `periods_D` whose position
    (their cell vector times `cell_vectors`, plus `offset`) is shortest (m > 1 on ties)."""
    d = len(periods_D)
    shifts = np.array(np.meshgrid(*[np.arange(-2, 3)] * d, indexing="ij")).reshape(d, -1).T
    candidates = np.asarray(vector_D)[None, :] + shifts * np.asarray(periods_D)[None, :]
    lengths = np.linalg.norm(candidates @ cell_vectors + (0 if offset is None else offset), axis=-1)
    return candidates[lengths < lengths.min() + 1e-9]


def site_map(small, large) -> np.ndarray:
    """[N_large, N_small] the linear map of a weight per site (`Hilbert`s of one lattice kind):
    each small-torus site at the shortest position from the point group's centre among its
    images, split over ties."""
    group_s, cells_s, cells_l = small.space_group, tuple(small.shape), tuple(large.shape)
    n_basis = small.n_sites // math.prod(cells_s)
    out = np.zeros((large.n_sites, small.n_sites))
    for i in range(small.n_sites):
        cell, b = np.unravel_index(i // n_basis, cells_s), i % n_basis
        offset = small.positions[i] - np.asarray(cell) @ group_s.vectors - group_s.center
        reps = shortest(cell, cells_s, group_s.vectors, offset)
        for rep in reps:
            j = np.ravel_multi_index(tuple(rep % np.asarray(cells_l)), cells_l) * n_basis + b
            out[j, i] += 1.0 / len(reps)
    return out


def _element_index(tables, group) -> np.ndarray:
    """[E] each space-group element's index among the GCNN tables' distinct elements."""
    lookup = {p: g for g, p in enumerate(tables.perms)}
    return np.asarray([lookup[tuple(int(i) for i in row)] for row in group.perm_ExN])


def element_map(small, tables_s, large, tables_l) -> np.ndarray:
    """[G_large, G_small] the linear map of a GCNN kernel over group elements: {R | t} to the
    same point operation R (matched by its matrix) with the shortest t' equal to t on the small
    torus, split over ties; an R the larger torus lacks is dropped."""
    gs, gl = small.space_group, large.space_group
    index_s, index_l = _element_index(tables_s, gs), _element_index(tables_l, gl)
    where_l = {(int(p), tuple(int(x) for x in t)): index_l[e] for e, (p, t) in enumerate(zip(gl.op_E, gl.shift_ExD))}
    op_to_l = [next((q for q, R in enumerate(gl.ops) if np.allclose(R, R_s)), None) for R_s in gs.ops]
    out = np.zeros((tables_l.n_elements, tables_s.n_elements))
    for g in range(tables_s.n_elements):
        e = int(np.flatnonzero(index_s == g)[0])  # one element acting as g
        p = op_to_l[int(gs.op_E[e])]
        if p is None:
            continue
        reps = shortest(gs.shift_ExD[e], gs.extents, gs.vectors)
        for rep in reps:
            out[where_l[(p, tuple(int(x) for x in rep % np.asarray(gl.extents)))], g] += 1.0 / len(reps)
    return out


def patch_map(small_grid, large_grid, patch_size, cell_vectors) -> np.ndarray:
    """[P_large, P_small] the ViT's positional bias by patch displacement: each small-grid
    displacement copied to its shortest images on the larger grid (to each of a tie), zero where
    none lands."""
    out = np.zeros((math.prod(large_grid), math.prod(small_grid)))
    for k in range(math.prod(small_grid)):
        delta = np.unravel_index(k, small_grid)
        for rep in shortest(np.asarray(delta) * patch_size, np.asarray(small_grid) * patch_size, cell_vectors):
            out[np.ravel_multi_index(tuple((rep // patch_size) % np.asarray(large_grid)), large_grid), k] = 1.0
    return out


def _along(matrix, leaf, axis):
    """`matrix` [new, old] applied along `axis` of `leaf`, in the leaf's dtype."""
    moved = np.moveaxis(np.asarray(leaf), axis, 0)
    mapped = np.tensordot(matrix.astype(moved.real.dtype), moved, axes=(1, 0))
    return np.moveaxis(mapped, 0, axis).astype(np.asarray(leaf).dtype)


def params(params_src, model_src, hilbert_src, model, hilbert):
    """The source model's parameters (a dict of NumPy leaves, `VMCState.params`) on this
    config's model and lattice (`runner.physics.hilbert.Hilbert`s of both): unchanged
    where the torus is the same, else by the rules of this module's docstring."""
    if tuple(hilbert_src.shape) == tuple(hilbert.shape):
        return params_src
    kind = type(model).__name__
    tree = dict(params_src)
    if kind == "RBMSymm":
        tree["kernel"] = _along(site_map(hilbert_src, hilbert), tree["kernel"], 0)
    elif kind == "GCNN":
        tree["kernel0"] = _along(site_map(hilbert_src, hilbert), tree["kernel0"], 0)
        groups = element_map(hilbert_src, model_src.hilbert, hilbert, model.hilbert)
        for name in [k for k in tree if k.startswith("kernel") and k != "kernel0"]:
            tree[name] = _along(groups, tree[name], 0)
    elif kind == "ViT":
        grid = lambda h: tuple(e // model.patch_size for e in h.shape)  # noqa: E731
        patches = patch_map(grid(hilbert_src), grid(hilbert), model.patch_size, hilbert.space_group.vectors)
        for name in [k for k in tree if k.startswith("position_bias")]:
            tree[name] = _along(patches, tree[name], 1)
    elif kind == "CNN":
        if "jastrow" in tree:
            tree["jastrow"] = _along(site_map(hilbert_src, hilbert), tree["jastrow"], 0)
    else:
        raise ConfigError("model", f"is {kind}, whose weights do not carry over to another lattice size")
    return tree
