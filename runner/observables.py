"""Observables as Pauli sums, evaluated together in one pass over the samples, with error bars.

An observable O (given in the user's original basis, rotated like the Hamiltonian before it
meets the model) has the local value O_loc(s) = sum_s' <s|O|s'> psi(s')/psi(s), whose mean over
samples of |psi|^2 is <O>. All observables of a set share one ratio psi(s')/psi(s) per distinct
connected configuration (the union of their flip masks); Z strings need no ratio at all. The
<Z_i Z_j> matrix and the structure factor S(q) = 1/N |sum_i e^{i q.r_i} s_i|^2 are read from the
samples directly. Means and error bars use `runner.stats.statistics`, as the energy does.
"""

import dataclasses
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from runner import operators
from runner.errors import ConfigError, require_int
from runner.hilbert import Hilbert
from runner.operators import PauliSum
from runner.sampler import FullSumSampler, full_sum, full_sum_weights, sample
from runner.stats import chain_max, chain_sum, statistics
from runner.vmc import local_energies, log_abs_max, map_over_samples, ratio_of

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


def _masks_of(op: PauliSum):
    """The flip masks of `op` as tuples, in the order of `operators.connected`'s elements."""
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
    simulated = tuple(operators.rotate_like(hamiltonian, op) for op in original)
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


# --- the config options (conf/observables/*.yaml) ------------------------------------------------


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
    return [(name, operators.pauli_sum(N, t, key=f"observables.{name}")) for name, t in terms.items()]


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
        return operators.pauli(hilbert._replace(total_sz=None), terms)
    except ConfigError as err:
        # pauli's keys: "terms" or "terms[k].coeff"
        raise ConfigError(key + err.key[len("terms"):], err.message) from None


# --- evaluation (jittable) -------------------------------------------------------------------------


def _real():
    return jnp.result_type(float)


class Local(NamedTuple):
    """Local values of an observable set on samples [C, T]."""

    values_CxTxM: jax.Array  # real, the M Pauli-sum observables (real part: they are Hermitian)
    sq_CxTxQ: jax.Array  # real, S(q) of each sample on every momentum q


def _ratios(obs: Observables, logpsi_fn, ratio_fn, params, sigma_N):
    """psi(s'_k)/psi(s) [K] for the union's K distinct flip masks, each evaluated once."""
    if ratio_fn is not None:
        return jnp.concatenate([
            ratio_fn(params, sigma_N, jnp.asarray(sites), -2 * sigma_N[sites]) for sites in obs.union_groups
        ])
    masks_KxN = np.ones((obs.n_connected, obs.n_sites), np.int8)
    start = 0
    for sites in obs.union_groups:
        masks_KxN[start + np.arange(len(sites))[:, None], sites] = -1
        start += len(sites)
    sigmap_KxN = sigma_N[None, :] * jnp.asarray(masks_KxN, sigma_N.dtype)
    return jnp.exp(logpsi_fn(params, sigmap_KxN) - logpsi_fn(params, sigma_N))


def _in_sector(obs: Observables, sigma_N):
    """[K] whether flipping each union mask keeps total Sz (the flipped spins sum to 0)."""
    return jnp.concatenate([jnp.sum(sigma_N[sites].astype(jnp.int32), axis=1) == 0 for sites in obs.union_groups])


def phases(obs: Observables):
    """(cos, sin) of q.r_i, [Q, N] each."""
    angle_QxN = obs.momenta_QxD @ obs.positions_NxD.T
    return np.cos(angle_QxN), np.sin(angle_QxN)


def local_values_one(obs: Observables, logpsi_fn, params, sigma_N, ratio_fn=None):
    """(values_M, sq_Q) of one configuration: the observables' local values (real part) and S(q).

    Args:
        obs: the observable set.
        logpsi_fn: (params, sigma_xN) -> log psi [...].
        params: model parameters.
        sigma_N: spins [N].
        ratio_fn: optional fast ratios (see `operators.local_energy`).
    """
    real = _real()
    ratio_K = mask_K = None
    if obs.n_connected:
        ratio_K = _ratios(obs, logpsi_fn, ratio_fn, params, sigma_N)
        mask_K = _in_sector(obs, sigma_N) if obs.sector else None
    values = []
    for op, diag_fn, index in zip(obs.simulated, obs.diagonal, obs.union_index):
        if diag_fn is not None and not len(index):  # mz2: not its N^2 / 2 Z strings
            values.append(jnp.real(diag_fn(sigma_N)).astype(real))
            continue
        _, mel_K, diag = operators.connected(op, sigma_N)
        value = diag if diag_fn is None else diag_fn(sigma_N)
        if len(index):
            keep_K = mel_K != 0
            if mask_K is not None:
                keep_K = keep_K & mask_K[index]
            terms_K = mel_K * ratio_K[index]
            # a zero element never multiplies its ratio (which may overflow)
            value = value + jnp.sum(jnp.where(keep_K, terms_K, jnp.zeros_like(terms_K)))
        values.append(jnp.real(value).astype(real))
    values_M = jnp.stack(values) if values else jnp.zeros((0,), real)
    cos_QxN, sin_QxN = phases(obs)
    s_N = sigma_N.astype(real)
    sq_Q = ((jnp.asarray(cos_QxN, real) @ s_N) ** 2 + (jnp.asarray(sin_QxN, real) @ s_N) ** 2) / obs.n_sites
    return values_M, sq_Q


def local_values(obs: Observables, problem, params, sigma_CxTxN) -> Local:
    """Local values of every observable on every sample, in one pass (one ratio per distinct
    connected configuration), `problem.chunk_size` samples at a time.

    Args:
        obs: the observable set.
        problem: the `runner.vmc.Problem` (model, chunk size).
        params: model parameters.
        sigma_CxTxN: samples [C, T, N].

    Returns:
        Local(values_CxTxM, sq_CxTxQ), real.
    """
    one = lambda s: local_values_one(obs, problem.logpsi, params, s, ratio_of(problem.model))  # noqa: E731
    values, sq = map_over_samples(jax.vmap(jax.vmap(one)), sigma_CxTxN, problem.chunk_per_chain)
    return Local(values, sq)


def correlation_sums(sigma_CxTxN):
    """Per-chain sums of s_i s_j, [C, N, N] (real): the <Z_i Z_j> matrix needs no ratio."""
    s = sigma_CxTxN.astype(_real())
    return jnp.einsum("cti,ctj->cij", s, s)


def measure(obs: Observables, local: Local, w_CxT=None, exact=False) -> dict:
    """Means and error bars of every observable (jittable); `w_CxT`: None for samples of
    |psi|^2, importance weights, or with `exact` a full sum's weights (exact means, error 0).

    Returns:
        {"obs/<name>": mean, "obs_error/<name>": error} (replicated scalars), plus
        "obs/structure_factor_q_index" (the momentum of the largest S(q)) when reported.
    """
    columns = lambda x_CxTxM: jnp.moveaxis(x_CxTxM, 2, 0)  # noqa: E731
    return _measure_columns(obs, columns(local.values_CxTxM), columns(local.sq_CxTxQ), w_CxT, exact)[0]


def _measure_columns(obs: Observables, values_MxCxT, sq_QxCxT, w_CxT=None, exact=False):
    """`measure` from the local values laid out observable-first, and S(q)'s Stats [Q].

    The statistics go one observable after another (`lax.map`): vmapped, XLA:CPU's FFT meets a
    layout it refuses (RET_CHECK in fft_thunk) once the chains are sharded over devices.
    """
    out = {}
    stats_of = lambda x_CxT: statistics(x_CxT, w_CxT, exact)  # noqa: E731
    if obs.names:
        stats_M = jax.lax.map(stats_of, values_MxCxT)
        for m, name in enumerate(obs.names):
            out[PREFIX + name] = stats_M.mean[m]
            out[ERROR_PREFIX + name] = stats_M.error_of_mean[m]
    stats_Q = jax.lax.map(stats_of, sq_QxCxT)
    if obs.structure_factor:
        q = jnp.argmax(stats_Q.mean)
        out[PREFIX + STRUCTURE_FACTOR] = stats_Q.mean[q]
        out[ERROR_PREFIX + STRUCTURE_FACTOR] = stats_Q.error_of_mean[q]
        out[PREFIX + "structure_factor_q_index"] = q
    return out, stats_Q


def step_observer(obs: Observables | None, problem) -> Callable | None:
    """The `observe` hook of `runner.vmc.vmc_step`: (params, sigma_CxTxN, w_CxT, step) ->
    metrics, measuring on the step's own samples (with their importance weights w, or None)
    where step % every == 0 (a `lax.cond`: the other steps compute nothing) and NaN elsewhere,
    with MEASURED = 1.0 / 0.0. None when every = 0, so the step is exactly the plain one.

    With a full sum the measurement is exact (error 0) and sums over every configuration of the
    space, as the final estimate does: over orbits the step's configurations are one per orbit,
    and most observables differ between the members of an orbit (`every_configuration`)."""
    if obs is None or obs.every <= 0:
        return None
    full_sum = isinstance(problem.sampler, FullSumSampler)
    over_orbits = full_sum and problem.sampler.symmetry != "none"

    def observe(params, sigma_CxTxN, w_CxT, step):
        def on():
            sigma, w = (every_configuration(problem.sampler, problem.amplitude, params) if over_orbits
                        else (sigma_CxTxN, w_CxT))
            return {**measure(obs, local_values(obs, problem, params, sigma), w, exact=full_sum),
                    MEASURED: jnp.ones((), _real())}

        def off():
            def blank(s):
                return jnp.full(s.shape, jnp.nan if jnp.issubdtype(s.dtype, jnp.floating) else 0, s.dtype)

            return {**jax.tree_util.tree_map(blank, jax.eval_shape(on)), MEASURED: jnp.zeros((), _real())}

        return jax.lax.cond(step % obs.every == 0, on, off)

    return observe


def every_configuration(sampler: FullSumSampler, amplitude, params):
    """(sigma [C, T, N], w [C, T]): every configuration of a full sum's space (not one per
    orbit: most observables differ between the members of an orbit) and its exact weight."""
    every = sampler if sampler.symmetry == "none" else full_sum(sampler.hilbert, sampler.n_chains)
    sigma_CxTxN = jnp.asarray(every.sigma_CxTxN)
    return sigma_CxTxN, full_sum_weights(every, amplitude, params, sigma_CxTxN)


def keep_measured(record: dict) -> dict:
    """A metrics record without the obs fields of a step that measured nothing (and the flag)."""
    record = dict(record)
    if not record.pop(MEASURED, None):
        record = {k: v for k, v in record.items() if not k.startswith((PREFIX, ERROR_PREFIX))}
    return record


def estimate(problem, obs: Observables, state, n_rounds: int = 1):
    """Energy and observables at the current parameters from the same fresh samples (of |psi|^2,
    whatever the sampler's `machine_pow` for training).

    Like `runner.vmc.estimate` (each chain's `n_rounds` rounds are one longer chain), with the
    observables' local values, S(q) and the per-chain <Z_i Z_j> sums taken on those samples.

    Returns:
        (chains, (energy_metrics, measured)): the advanced chains; the energy's metrics as
        `runner.vmc.estimate` gives them; `measure`'s dict plus "zz_sum_CxNxN" (per-chain sums
        of s_i s_j over all rounds), "sq_mean_Q" and "sq_error_Q" (S(q) on every momentum).
    """
    from runner.vmc import _metrics
    from runner.vmc import estimate as estimate_energy

    if isinstance(problem.sampler, FullSumSampler):
        # The energy from the run's sum (over orbits with a symmetry), the observables from every
        # configuration.
        chains, energy = estimate_energy(problem, state)
        sigma_CxTxN, w_CxT = every_configuration(problem.sampler, problem.amplitude, state.params)
        local = local_values(obs, problem, state.params, sigma_CxTxN)
        out, stats_Q = _measure_columns(obs, jnp.moveaxis(local.values_CxTxM, 2, 0),
                                        jnp.moveaxis(local.sq_CxTxQ, 2, 0), w_CxT, exact=True)
        s_CxTxN = sigma_CxTxN.astype(_real())
        zz_NxN = chain_sum(jnp.einsum("ct,cti,ctj->cij", w_CxT, s_CxTxN, s_CxTxN))
        measured = {**out, "zz_exact_NxN": zz_NxN, "sq_mean_Q": stats_Q.mean, "sq_error_Q": stats_Q.error_of_mean}
        return chains, (energy, measured)

    def one_round(carry, _):
        chains, zz_CxNxN = carry
        chains, sigma_CxTxN, acceptance = sample(problem.sampler, problem.amplitude, state.params, chains)
        eloc_CxT = local_energies(problem, state.params, sigma_CxTxN)
        local = local_values(obs, problem, state.params, sigma_CxTxN)
        return (chains, zz_CxNxN + correlation_sums(sigma_CxTxN)), (eloc_CxT, local, acceptance,
                                                                   log_abs_max(problem, state.params, sigma_CxTxN))

    C, N = state.chains.sigma_CxN.shape
    zz0 = jnp.zeros((C, N, N), _real())
    (chains, zz_CxNxN), (eloc_RxCxT, local_R, acceptance_R, log_abs_RxC) = jax.lax.scan(
        one_round, (state.chains, zz0), length=n_rounds)

    def columns(x_RxCxTxM):  # [M, C, R*T]: each chain's rounds one after another
        R, C, T, M = x_RxCxTxM.shape
        return jnp.transpose(x_RxCxTxM, (3, 1, 0, 2)).reshape(M, C, R * T)

    eloc_CxRT = jnp.moveaxis(eloc_RxCxT, 0, 1).reshape(eloc_RxCxT.shape[1], -1)
    energy = {**_metrics(statistics(eloc_CxRT), jnp.mean(acceptance_R)),
              "log_abs_max": chain_max(jnp.moveaxis(log_abs_RxC, 0, 1))}
    out, stats_Q = _measure_columns(obs, columns(local_R.values_CxTxM), columns(local_R.sq_CxTxQ))
    measured = {**out, "zz_sum_CxNxN": zz_CxNxN, "sq_mean_Q": stats_Q.mean, "sq_error_Q": stats_Q.error_of_mean}
    return chains, (energy, measured)


# --- results (host) --------------------------------------------------------------------------------


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


def expect(obs: Observables, problem, params, sigma_CxTxN, w_CxT=None) -> dict:
    """{name: {"mean", "error"}} of every observable on given samples of |psi|^2 [C, T, N] (host
    values; jits the evaluation), or on a full sum's configurations with their weights w [C, T]
    (exact). For evaluation and the Python API."""
    fn = jax.jit(lambda p, s, w: measure(obs, local_values(obs, problem, p, s), w, exact=True))
    measured = jax.device_get(fn(params, sigma_CxTxN, w_CxT))
    out = {name: {"mean": _number(measured[PREFIX + name]), "error": _number(measured[ERROR_PREFIX + name])}
           for name in obs.all_names}
    return out


def build(node: dict | None, hilbert: Hilbert, hamiltonian: PauliSum) -> Observables | None:
    """The observables of the config group `observables` (None or missing: none)."""
    if node is None:
        return None
    from runner.build import instantiate

    return instantiate("observables", node, hilbert=hilbert, hamiltonian=hamiltonian)
