"""Starts that move: every model's initial state (model.init with the run's seed) on frustrated and
bipartite Heisenberg lattices in S^z = 0 is no eigenstate, has a nonzero energy gradient and is not
the flat state (the ferromagnet where no sign rule applies), by exact sums over the whole sector."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from runner.config.build import build
from runner.physics import hilbert as hb
from runner.physics import pauli
from tests.helpers.config import CONF, compose_config

MODELS = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))
# 12 and 16 sites (an odd triangular 3 x 3 has no S^z = 0 sector); J2 = 0.5 frustrates the square.
LATTICES = {"triangular4": ["hilbert=triangular", "hilbert.L=4"], "kagome2": ["hilbert=kagome", "hilbert.L=2"],
            "square4": ["hilbert=square", "hilbert.L=4"],
            "square4_j2": ["hilbert=square", "hilbert.L=4", "hamiltonian.J2=0.5"]}
# Thresholds an order of magnitude below the weakest start kept (the RBM's, CNN's, Jastrow's, on
# which the golden runs rest) and several above the flat start (docs/notes/starts.md).
MIN_VARIANCE_PER_SITE = 1e-3  # <(H - E)^2> / N
MIN_GRADIENT_NORM = 1e-2  # |dE/dtheta|
MIN_DISTANCE_PER_SITE = 1e-5  # |E - E_flat| / N


def initial_moments(experiment):
    """(E, <(H - E)^2>, |dE/dtheta|, E_flat) of the seed's initial parameters, exact over the space
    (the flat state: the uniform superposition of its configurations)."""
    problem = experiment.problem
    states = jnp.asarray(hb.all_states(experiment.hilbert))
    H = pauli.to_sparse(experiment.hamiltonian, np.asarray(states)).tocsr()
    params = problem.model.init(jax.random.PRNGKey(experiment.settings.seed), states[0])["params"]
    flat, unravel = ravel_pytree(params)
    logpsi = jax.jit(lambda v: problem.logpsi(unravel(v), states))
    log_D = np.asarray(logpsi(flat))
    shift = float(np.max(log_D.real))
    psi = np.exp(log_D - shift)
    norm = np.vdot(psi, psi).real
    h_psi = H @ psi
    E = np.vdot(psi, h_psi).real / norm
    variance = np.vdot(h_psi, h_psi).real / norm - E**2
    # dE/dtheta = 2 Re <(H - E) psi | d psi> / <psi|psi> for real parameters
    residual = jnp.asarray((h_psi - E * psi) / norm)
    gradient = jax.jit(jax.grad(lambda v: 2 * jnp.real(jnp.vdot(residual, jnp.exp(logpsi(v) - shift)))))(flat)
    uniform = np.full(len(states), len(states) ** -0.5)
    return E, variance, float(jnp.linalg.norm(gradient)), np.vdot(uniform, H @ uniform).real


@pytest.mark.slow
@pytest.mark.parametrize("lattice", LATTICES)
@pytest.mark.parametrize("model", MODELS)
def test_initial_state_moves(model, lattice):
    experiment = build(compose_config([*LATTICES[lattice], "hilbert.total_sz=0", "hamiltonian=heisenberg",
                                       "sampler=metropolis_exchange", f"model={model}"]))
    n = experiment.hilbert.n_sites
    E, variance, gradient_norm, E_flat = initial_moments(experiment)
    assert variance / n > MIN_VARIANCE_PER_SITE, (E, variance)
    assert gradient_norm > MIN_GRADIENT_NORM
    assert abs(E - E_flat) / n > MIN_DISTANCE_PER_SITE, (E, E_flat)


def test_flat_state_is_the_ferromagnet_and_fails():
    """The check's reference: on the triangular lattice the flat S^z = 0 state has E = J n_bonds and
    no variance, which every threshold above refuses."""
    experiment = build(compose_config(["hilbert=triangular", "hilbert.L=4", "hilbert.total_sz=0",
                                       "hamiltonian=heisenberg", "sampler=metropolis_exchange", "model=jastrow"]))
    states = hb.all_states(experiment.hilbert)
    H = pauli.to_sparse(experiment.hamiltonian, states).tocsr()
    uniform = np.full(len(states), len(states) ** -0.5)
    h_u = H @ uniform
    E = np.vdot(uniform, h_u).real
    assert E == pytest.approx(3 * experiment.hilbert.n_sites)  # 3 N bonds, each s.s = 1
    assert np.vdot(h_u, h_u).real - E**2 < MIN_VARIANCE_PER_SITE * 1e-6
