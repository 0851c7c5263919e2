"""plus_x for every model: psi exactly uniform, and the exact first-order response -i (H - E) psi of
the TFIM quench in the span of the log-derivatives (dense over all 2^N configurations, on a chain, a
square and a triangular torus), and the runner's own first TDVP residual zero; the models that
cannot refuse with a ConfigError on task.initial_state."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from runner.config.build import build
from runner.errors import ConfigError
from runner.core.sampler import init_chains
from runner.lifecycle import dynamics as dyn
from runner.physics import hilbert as hb
from tests.helpers.config import CONF, compose_config
from tests.helpers.dense import basis_index, dense_ising

L, H_QUENCH = 6, 0.5
# the config groups' models, and variants by their overrides
VARIANTS = {"cnn+jastrow": ["model=cnn", "model.jastrow=true"]}
MODELS = sorted([*(p.stem for p in (CONF / "model").glob("*.yaml")), *VARIANTS])
# the rest have no plus_x (docs/dynamics.md)
ACCEPTED = ("cnn", "cnn+jastrow", "gcnn", "jastrow", "mlp", "rbm", "rbm_symm")
LATTICES = {"chain": [f"hilbert.L={L}"], "square": ["hilbert=square", "hilbert.L=3"],
            "triangular": ["hilbert=triangular", "hilbert.L=3"]}
SLOW = {"cnn", "cnn+jastrow", "gcnn"}
SMALLER = {"gcnn": ["model.features=[2,2]"]}  # on the tori: the default's TDVP over 108 elements takes minutes
MAX_RESIDUAL = 1e-6  # |O c - r| / |r| at the least-squares c


def _experiment(model, lattice="chain"):
    smaller = SMALLER.get(model, []) if lattice != "chain" else []
    chosen = VARIANTS.get(model, [f"model={model}"])
    return build(compose_config(["task=dynamics", *LATTICES[lattice], f"hamiltonian.h={H_QUENCH}", *chosen,
                                 "dtype=complex128", "sampler=full_sum", *smaller]))


def tangent_residual(problem, hilbert, params, states):
    """(spread of log psi, relative least-squares residual of the first-order response (H - E) psi / psi,
    centred, by the centred log-derivatives), uniform weights: psi is uniform."""
    flat, unravel = ravel_pytree(params)
    logpsi = lambda v: problem.logpsi(unravel(v), states)  # noqa: E731
    log_D = np.asarray(jax.jit(logpsi)(flat))
    one = lambda v, state: problem.logpsi(unravel(v), state[None])[0]  # noqa: E731
    O_DxP = np.asarray(jax.jit(jax.vmap(jax.grad(one, holomorphic=True), in_axes=(None, 0)))(flat, states))
    n = states.shape[-1]
    H = dense_ising(hilbert.bonds, n, 1.0, H_QUENCH)[np.ix_(basis_index(states), basis_index(states))]
    psi = np.exp(log_D - log_D[0])
    r = H @ psi / psi
    r = r - r.mean()
    O_DxP = O_DxP - O_DxP.mean(axis=0)
    c, *_ = np.linalg.lstsq(O_DxP, r, rcond=None)
    return float(np.max(np.abs(log_D - log_D[0]))), float(np.linalg.norm(O_DxP @ c - r) / np.linalg.norm(r))


CASES = [pytest.param(m, lattice, marks=pytest.mark.slow) if m in SLOW or lattice != "chain" else (m, lattice)
         for lattice in LATTICES for m in MODELS if m in ACCEPTED or lattice == "chain"]


@pytest.mark.parametrize(("model", "lattice"), CASES)
def test_plus_x_is_uniform_with_a_full_tangent_or_refused(model, lattice):
    experiment = _experiment(model, lattice)
    if model not in ACCEPTED:
        with pytest.raises(ConfigError, match=f"task.initial_state is plus_x, which the model "
                                              f"{type(experiment.problem.model).__name__} cannot represent"):
            dyn.check(experiment)
        return
    dyn.check(experiment)
    problem = experiment.problem
    params = dyn._plus_x_params(problem, experiment.settings.seed)
    spread, residual = tangent_residual(problem, experiment.hilbert, params,
                                        jnp.asarray(hb.all_states(experiment.hilbert)))
    assert spread < 1e-12
    assert residual < MAX_RESIDUAL
    # the runner's own first step: its TDVP residual r^2 over the full sum
    _, metrics = jax.jit(lambda p, c: dyn.measure(problem, experiment.settings.task.equation, None, p, c))(
        params, init_chains(problem.sampler, 0))
    assert float(metrics["residual"]) < MAX_RESIDUAL


def test_every_parameter_zero_freezes_the_rbm():
    """Why the RBM is refused: with W = 0 its log-derivatives are linear in the spins, orthogonal to
    the two-body response (the residual is 1)."""
    experiment = _experiment("rbm")
    problem = experiment.problem
    params = problem.model.init(jax.random.PRNGKey(0), jnp.ones(L, jnp.int8))["params"]
    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    spread, residual = tangent_residual(problem, experiment.hilbert, zeros, jnp.asarray(hb.all_states(experiment.hilbert)))
    assert spread < 1e-12 and residual == pytest.approx(1.0, abs=1e-9)
