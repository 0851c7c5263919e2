"""Exact expectations over all 2^6 states of a Heisenberg chain: models (one not holomorphic), the
exact energy and its Wirtinger gradient, Obar and eps weighted by sqrt(p)."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree

from models import MLP, RBM, Jastrow
from models.common import normal
from runner.core import local_energy, precond
from runner.core.jacobian import log_derivatives
from runner.core.problem import Problem
from runner.physics import hamiltonians, pauli
from runner.physics import hilbert as hb


class NonHolomorphic(nn.Module):
    """A complex-parameter model that is not holomorphic (uses conj): exercises the split path."""

    param_dtype: jnp.dtype = jnp.complex128

    @nn.compact
    def __call__(self, sigma_xN):
        n = sigma_xN.shape[-1]
        w = self.param("w", normal(0.3), (n,), self.param_dtype)
        x = sigma_xN.astype(self.param_dtype)
        return x @ w + 0.5 * jnp.tanh(x @ jnp.conj(w))


MODELS = {
    "rbm_real": RBM(alpha=1, param_dtype=jnp.float64),
    "rbm_complex": RBM(alpha=1, param_dtype=jnp.complex128),
    "jastrow_complex": Jastrow(param_dtype=jnp.complex128),
    "mlp_real": MLP(hidden=(5, 4), param_dtype=jnp.float64),
    "nonholomorphic": NonHolomorphic(),
}


def exact_setup(model_name, seed=0):
    lattice = hb.chain(6)
    ham = hamiltonians.heisenberg(lattice, J=1.0, J2=0.3, phase_prior="none")
    model = MODELS[model_name]
    states = jnp.asarray(hb.all_states(lattice))
    params = model.init(jax.random.PRNGKey(seed), states[0])["params"]
    params = jax.tree_util.tree_map(lambda x: x * 20, params)
    H = jnp.asarray(pauli.to_sparse(ham, np.asarray(states)).toarray())
    return lattice, ham, model, states, params, H


def exact_energy(model, states, H):
    """params -> <psi|H|psi> / <psi|psi>, compiled (eagerly, a deep model is hundreds of small
    programs)."""
    def energy(params):
        psi = jnp.exp(model.apply({"params": params}, states))
        return jnp.real(jnp.vdot(psi, H @ psi) / jnp.vdot(psi, psi))

    return jax.jit(energy)


def exact_weighted(problem, params, states, mode):
    """Obar and eps weighted by sqrt(p): Obar^H eps and Obar^H Obar are exact expectations
    (one compiled program)."""
    return jax.jit(functools.partial(_weighted, problem, mode=mode))(params, states)


def _weighted(problem, params, states, mode):
    logpsi = problem.model.apply({"params": params}, states)
    p = jnp.exp(2 * jnp.real(logpsi))
    p = p / jnp.sum(p)
    eloc = jax.vmap(lambda s: local_energy.local_energy(problem.hamiltonian, problem.logpsi, params, s))(states)
    O = log_derivatives(problem, params, states[None], mode)[0]
    E = jnp.sum(p * eloc)
    Obar = jnp.sqrt(p)[:, None] * (O - jnp.sum(p[:, None] * O, axis=0))
    eps = jnp.sqrt(p) * (eloc - E)
    return Obar, eps, E


def wirtinger_reference(energy, params):
    """The gradient convention of the core: dE/dtheta for real, dE/dx + i dE/dy for complex."""
    flat, unravel = ravel_pytree(params)
    if not jnp.iscomplexobj(flat):
        return jax.jit(jax.grad(lambda v: energy(unravel(v))))(flat)
    n = flat.shape[0]
    split = jnp.concatenate([flat.real, flat.imag])
    g = jax.jit(jax.grad(lambda v: energy(unravel(v[:n] + 1j * v[n:]))))(split)
    return g[:n] + 1j * g[n:]


def problem_of(model, ham):
    return Problem(ham, model, sampler=None, optimizer=optax.sgd(0.1), precondition=precond.none())


