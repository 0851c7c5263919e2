"""Observables as Pauli sums, evaluated together in one pass over the samples, with error bars.

An observable O (given in the user's original basis, rotated like the Hamiltonian before it
meets the model) has the local value O_loc(s) = sum_s' <s|O|s'> psi(s')/psi(s), whose mean over
samples of |psi|^2 is <O>. All observables of a set share one ratio psi(s')/psi(s) per distinct
connected configuration (the union of their flip masks); Z strings need no ratio at all. The
<Z_i Z_j> matrix and the structure factor S(q) = 1/N |sum_i e^{i q.r_i} s_i|^2 are read from the
samples directly. Means and error bars use `runner.core.stats.statistics`, as the energy does.
"""

import dataclasses

import jax.numpy as jnp
import numpy as np

from runner.errors import ConfigError, require_int
from runner.physics import exact, hamiltonians, pauli
from runner.physics.hilbert import Hilbert, all_states
from runner.physics.pauli import PauliSum

SPIN_NAMES = ("magnetization_x", "magnetization_z", "mz2", "zz_nn", "xx_nn", "structure_factor_zz")

STRUCTURE_FACTOR = "structure_factor_zz"

MEASURED = "obs_measured"  # per-step flag: 1 where the step measured its observables

PREFIX, ERROR_PREFIX = "obs/", "obs_error/"  # metrics.jsonl fields: obs/<name>, obs_error/<name>


@dataclasses.dataclass(frozen=True, eq=False)
class Observables:
    """A set of observables, built once from the config and closed over by jit.

    Attributes:
        names: the Pauli-sum observables' names, in order.
        operators: their PauliSums in the user's original basis.
        simulated: the same rotated like the Hamiltonian (what the model's state sees).
        diagonal: per observable, None or a closed form sigma_N -> <s|O|s> replacing the sign
            products of its Z strings (mz2 has N^2 of them, (sum_i s_i)^2 / N^2 is O(N)).
        every: measure during training every that many steps (0: only at the end).
        structure_factor: whether `structure_factor_zz` (max over momenta of S(q)) is reported.
        sector: the Hilbert space fixes total Sz: connected configurations outside it are dropped.
        positions_NxD: site positions r_i.
        momenta_QxD: the lattice's momenta q.
        union_groups: flip_sites [K_J, J] of the distinct flip masks of all observables, by J.
        union_index: per observable, int [K_m], the position of each of its masks in the union.
    """

    names: tuple
    operators: tuple
    simulated: tuple
    diagonal: tuple
    every: int
    structure_factor: bool
    sector: bool
    positions_NxD: np.ndarray
    momenta_QxD: np.ndarray
    union_groups: tuple
    union_index: tuple

    @property
    def n_sites(self) -> int:
        return self.positions_NxD.shape[0]

    @property
    def n_connected(self) -> int:
        """Number of distinct connected configurations (ratios) per sample."""
        return sum(len(g) for g in self.union_groups)

    @property
    def all_names(self) -> tuple:
        """Every reported name: the Pauli sums, then `structure_factor_zz` when reported."""
        return self.names + ((STRUCTURE_FACTOR,) if self.structure_factor else ())


def _real():
    return jnp.result_type(float)


def _masks_of(op: PauliSum):
    """The flip masks of `op` as tuples, in the order of `local_energy.connected`'s elements."""
    return [tuple(int(s) for s in row) for g in op.groups for row in g.flip_sites]


def make(hilbert: Hilbert, hamiltonian: PauliSum, named_ops, every: int = 0,
         structure_factor: bool = False, diagonal=None) -> Observables:
    """An Observables from PauliSums in the user's basis.

    Args:
        hilbert: the lattice.
        hamiltonian: the Hamiltonian as simulated (its `rotated` says how to rotate).
        named_ops: [(name, PauliSum)] in the user's original basis.
        every: measurement interval during training (0: only at the end).
        structure_factor: report `structure_factor_zz` and `structure_factor_q`.
        diagonal: optional {name: sigma_N -> scalar}, closed forms of diagonal parts.
    """
    diagonal = diagonal or {}
    names = tuple(name for name, _ in named_ops)
    original = tuple(op for _, op in named_ops)
    simulated = tuple(pauli.rotate_like(hamiltonian, op) for op in original)
    union = sorted({m for op in simulated for m in _masks_of(op)}, key=lambda m: (len(m), m))
    position = {m: k for k, m in enumerate(union)}
    union_groups = tuple(
        np.array([m for m in union if len(m) == J], np.int32).reshape(-1, J)
        for J in sorted({len(m) for m in union})
    )
    union_index = tuple(np.array([position[m] for m in _masks_of(op)], np.int32) for op in simulated)
    return Observables(
        names, original, simulated, tuple(diagonal.get(n) for n in names), every, structure_factor,
        hilbert.total_sz is not None, np.asarray(hilbert.positions, np.float64),
        np.asarray(hilbert.momenta, np.float64).reshape(-1, np.asarray(hilbert.positions).shape[1]),
        union_groups, union_index,
    )


def _every(every) -> int:
    return require_int("every", every, minimum=0)


def none(hilbert: Hilbert, hamiltonian: PauliSum) -> None:
    """No observables (the default)."""
    return None


def spin_operators(hilbert: Hilbert) -> list:
    """[(name, PauliSum)] of the standard set's Pauli sums (user's basis), without S(q)."""
    N = hilbert.n_sites
    bonds = [tuple(int(s) for s in b) for b in hilbert.bonds]
    B = max(len(bonds), 1)
    # (sum_i Z_i)^2 = N + sum_{i != j} Z_i Z_j
    mz2 = [(1.0 / N**2, "ZZ", (i, i)) for i in range(N)]  # Z_i Z_i = 1
    mz2 += [(2.0 / N**2, "ZZ", (i, j)) for i in range(N) for j in range(i + 1, N)]
    terms = {
        "magnetization_x": [(1.0 / N, "X", (i,)) for i in range(N)],
        "magnetization_z": [(1.0 / N, "Z", (i,)) for i in range(N)],
        "mz2": mz2,
        "zz_nn": [(1.0 / B, "ZZ", b) for b in bonds],
        "xx_nn": [(1.0 / B, "XX", b) for b in bonds],
    }
    return [(name, pauli.pauli_sum(N, t, key=f"observables.{name}")) for name, t in terms.items()]


def spin(hilbert: Hilbert, hamiltonian: PauliSum, every: int = 0) -> Observables:
    """The standard set: magnetization_x, magnetization_z (1/N sum_i <X_i>, <Z_i>), mz2
    (<(sum_i Z_i)^2>/N^2), zz_nn and xx_nn (mean <Z_i Z_j>, <X_i X_j> over bonds) and
    structure_factor_zz (the largest S(q) over the lattice's momenta, at structure_factor_q).

    Args:
        hilbert: the lattice.
        hamiltonian: the simulated Hamiltonian (for its basis rotation).
        every: measure during training every that many steps (0: only at the end).
    """
    every = _every(every)
    N = hilbert.n_sites
    mz2 = lambda sigma_N: jnp.sum(sigma_N.astype(_real()))**2 / N**2  # noqa: E731
    return make(hilbert, hamiltonian, spin_operators(hilbert), every, structure_factor=True,
                diagonal={"mz2": mz2})


def custom(hilbert: Hilbert, hamiltonian: PauliSum, operators: dict, every: int = 0) -> Observables:
    """Named Pauli sums written like the `pauli` Hamiltonian's terms.

    Args:
        hilbert: the lattice.
        hamiltonian: the simulated Hamiltonian (for its basis rotation).
        operators: {name: [{coeff, ops, on}, ...]}, each a Hermitian Pauli sum in the user's
            original basis (`on`: sites, bonds, next_bonds or a list of site tuples).
        every: measure during training every that many steps (0: only at the end).
    """
    every = _every(every)
    if not isinstance(operators, dict) or not operators:
        raise ConfigError("observables.operators", "must be a non-empty mapping {name: [{coeff, ops, on}, ...]}")
    return make(hilbert, hamiltonian, [(name, pauli_terms(hilbert, name, terms)) for name, terms in operators.items()],
                every)


def pauli_terms(hilbert: Hilbert, name: str, terms) -> PauliSum:
    """The PauliSum of `pauli`-style terms [{coeff, ops, on}] in the user's basis; errors name
    `observables.operators.<name>`. Any operator is allowed in an Sz sector (its elements that
    leave the sector do not count)."""
    key = f"observables.operators.{name}"
    if not isinstance(name, str) or not name or "/" in name:
        raise ConfigError(key, "needs a non-empty name without '/'")
    try:
        return hamiltonians.pauli(hilbert._replace(total_sz=None), terms)
    except ConfigError as err:
        # pauli's keys: "terms" or "terms[k].coeff"
        raise ConfigError(key + err.key[len("terms"):], err.message) from None


def exact_values(obs: Observables, hilbert: Hilbert, psi_D) -> tuple[dict, dict]:
    """The observables in a state given exactly, with no sampling: what a run writes beside its
    estimates (`results`).

    Args:
        obs: the observable set.
        hilbert: the space `psi_D` lives on (the run's, its Sz sector included).
        psi_D: amplitudes on `all_states(hilbert)` in the basis the Hamiltonian is simulated in
            (the ground vector of `runner.physics.exact.ground_state`).

    Returns:
        ({"exact_observables": {name: value}} for every reported name (`structure_factor_zz` the
        largest exact S(q)), {"exact_zz": <Z_i Z_j> [N][N], "exact_structure_factor": S(q) on
        every momentum, aligned with `momenta`}).
    """
    psi_D = np.asarray(psi_D)
    p_D = np.abs(psi_D) ** 2 / np.sum(np.abs(psi_D) ** 2)
    s_DxN = all_states(hilbert).astype(np.float64)
    zz_NxN = s_DxN.T @ (p_D[:, None] * s_DxN)
    angle_QxNxN = np.einsum("qd,nd->qn", obs.momenta_QxD, obs.positions_NxD)
    # S(q) = 1/N sum_ij cos(q.(r_i - r_j)) <Z_i Z_j>
    sq_Q = np.einsum("qij,ij->q", np.cos(angle_QxNxN[:, :, None] - angle_QxNxN[:, None, :]), zz_NxN) / obs.n_sites
    values = {name: exact.expectation(op, hilbert, psi_D) for name, op in zip(obs.names, obs.simulated)}
    if obs.structure_factor:
        values[STRUCTURE_FACTOR] = float(np.max(sq_Q))
    return ({"exact_observables": values},
            {"exact_zz": zz_NxN.tolist(), "exact_structure_factor": [float(x) for x in sq_Q]})


def keep_measured(record: dict) -> dict:
    """A metrics record without the obs fields of a step that measured nothing (and the flag)."""
    record = dict(record)
    if not record.pop(MEASURED, None):
        record = {k: v for k, v in record.items() if not k.startswith((PREFIX, ERROR_PREFIX))}
    return record


def _number(x):
    x = float(x)
    return x if np.isfinite(x) else None


def results(obs: Observables, measured: dict, n_per_chain: int) -> tuple[dict, dict]:
    """What a run writes: (summary fields, correlations.json) from `estimate`'s `measured`
    (on the host).

    Args:
        obs: the observable set.
        measured: `estimate`'s second output's `measured` dict, as NumPy.
        n_per_chain: samples per chain behind it (n_rounds * n_samples / n_chains).

    Returns:
        ({"observables": {name: {"mean", "error"}}, "structure_factor_q": [q...] (spin set)},
         {"n_sites", "positions", "zz", "zz_error", "momenta", "structure_factor",
          "structure_factor_error"}); zz_error is the spread of the chains' own means over
          sqrt(C) (null with one chain), an error that accounts for autocorrelation; after a
          full sum (measured["zz_exact_NxN"]) the exact values and errors 0.
    """
    values = {name: {"mean": _number(measured[PREFIX + name]), "error": _number(measured[ERROR_PREFIX + name])}
              for name in obs.all_names}
    summary = {"observables": values}
    if obs.structure_factor:
        q = int(measured[PREFIX + "structure_factor_q_index"])
        summary["structure_factor_q"] = [float(x) for x in obs.momenta_QxD[q]]
    if "zz_exact_NxN" in measured:  # a full sum: exact, no error
        zz = np.asarray(measured["zz_exact_NxN"], np.float64)
        zz_error = np.zeros_like(zz)
    else:
        zz_CxNxN = np.asarray(measured["zz_sum_CxNxN"], np.float64) / n_per_chain
        C = zz_CxNxN.shape[0]
        zz = zz_CxNxN.mean(axis=0)
        zz_error = zz_CxNxN.std(axis=0, ddof=1) / np.sqrt(C) if C > 1 else np.full_like(zz, np.nan)
    as_list = lambda a: [[_number(x) for x in row] for row in a]  # noqa: E731
    correlations = {
        "n_sites": obs.n_sites,
        "positions": obs.positions_NxD.tolist(),
        "zz": as_list(zz),
        "zz_error": as_list(zz_error),
        "momenta": obs.momenta_QxD.tolist(),
        "structure_factor": [_number(x) for x in measured["sq_mean_Q"]],
        "structure_factor_error": [_number(x) for x in measured["sq_error_Q"]],
    }
    return summary, correlations
