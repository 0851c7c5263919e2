"""plus_x for every model: psi exactly uniform, and the exact first-order response -i (H - E) psi of
the TFIM quench in the span of the log-derivatives (dense over all 2^L configurations); the models
that cannot refuse with a ConfigError on task.initial_state."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from runner.config.build import build
from runner.errors import ConfigError
from runner.lifecycle import dynamics as dyn
from runner.physics import hilbert as hb
from tests.helpers.config import CONF, compose_config
from tests.helpers.dense import basis_index, dense_ising

L, H_QUENCH = 6, 0.5
MODELS = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))
ACCEPTED = ("cnn", "jastrow")  # the rest have no plus_x (docs/dynamics.md)
MAX_RESIDUAL = 1e-6  # |O c - r| / |r| at the least-squares c


def _experiment(model):
    return build(compose_config(["task=dynamics", f"hilbert.L={L}", f"hamiltonian.h={H_QUENCH}", f"model={model}",
                                 "dtype=complex128", "sampler=full_sum"]))


def tangent_residual(problem, params, states):
    """(spread of log psi, relative least-squares residual of the first-order response (H - E) psi / psi,
    centred, by the centred log-derivatives), uniform weights: psi is uniform."""
    flat, unravel = ravel_pytree(params)
    logpsi = lambda v: problem.logpsi(unravel(v), states)  # noqa: E731
    log_D = np.asarray(jax.jit(logpsi)(flat))
    O_DxP = np.asarray(jax.jit(jax.jacfwd(logpsi, holomorphic=True))(flat))
    H = dense_ising(hb.chain(L).bonds, L, 1.0, H_QUENCH)[np.ix_(basis_index(states), basis_index(states))]
    psi = np.exp(log_D - log_D[0])
    r = H @ psi / psi
    r = r - r.mean()
    O_DxP = O_DxP - O_DxP.mean(axis=0)
    c, *_ = np.linalg.lstsq(O_DxP, r, rcond=None)
    return float(np.max(np.abs(log_D - log_D[0]))), float(np.linalg.norm(O_DxP @ c - r) / np.linalg.norm(r))


@pytest.mark.parametrize("model", [pytest.param(m, marks=pytest.mark.slow) if m == "cnn" else m for m in MODELS])
def test_plus_x_is_uniform_with_a_full_tangent_or_refused(model):
    experiment = _experiment(model)
    if model not in ACCEPTED:
        with pytest.raises(ConfigError, match=f"task.initial_state is plus_x, which the model "
                                              f"{type(experiment.problem.model).__name__} cannot represent"):
            dyn.check(experiment)
        return
    dyn.check(experiment)
    params = dyn._plus_x_params(experiment.problem, experiment.settings.seed)
    spread, residual = tangent_residual(experiment.problem, params, jnp.asarray(hb.all_states(experiment.hilbert)))
    assert spread < 1e-12
    assert residual < MAX_RESIDUAL


def test_every_parameter_zero_freezes_the_rbm():
    """Why the RBM is refused: with W = 0 its log-derivatives are linear in the spins, orthogonal to
    the two-body response (the residual is 1)."""
    experiment = _experiment("rbm")
    problem = experiment.problem
    params = problem.model.init(jax.random.PRNGKey(0), jnp.ones(L, jnp.int8))["params"]
    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    spread, residual = tangent_residual(problem, zeros, jnp.asarray(hb.all_states(experiment.hilbert)))
    assert spread < 1e-12 and residual == pytest.approx(1.0, abs=1e-9)
