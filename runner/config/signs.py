"""The signs and phases a model must be able to carry: a phase prior's complex elements are refused
for a real wavefunction, a sign problem it cannot represent is warned about."""

import logging
import warnings

import jax
import jax.numpy as jnp

from runner.errors import ConfigError
from runner.physics import pauli

REAL = ("float32", "float64", "float32_mixed")  # dtypes whose parameters are real


def check(model, hilbert, hamiltonian, dtype_name: str, excited_states: bool, node: dict):
    """Refuses a phase prior's complex H for a real log psi (`node`: the hamiltonian group's config);
    warns where a real log psi meets a non-stoquastic H or excited states."""
    _check_phases(node, hilbert, hamiltonian, model, dtype_name)
    _warn_on_signs(model, hilbert, hamiltonian, dtype_name, excited_states)


def _complex_log_psi(model, hilbert) -> bool:
    """Whether the model's log psi is complex, read from its abstract evaluation (`jax.eval_shape`:
    no device touched)."""

    def log_psi():
        sigma = jnp.ones((1, hilbert.n_sites), jnp.int8)
        return model.apply(model.init(jax.random.PRNGKey(0), sigma), sigma)

    with warnings.catch_warnings():  # x64 is not set yet: float64 requests would warn of truncation
        warnings.simplefilter("ignore")
        return jnp.iscomplexobj(jax.eval_shape(log_psi))


def _check_phases(node, hilbert, hamiltonian, model, dtype_name):
    """Refuses the complex elements a phase prior gives H for a model whose log psi is real."""
    if not hamiltonian.is_real and dtype_name in REAL and not _complex_log_psi(model, hilbert):
        prior = node.get("phase_prior")
        prior = "auto (three_sublattice on this lattice)" if prior == "auto" else prior
        raise ConfigError("hamiltonian.phase_prior", f"{prior} gives H complex "
                          f"elements, which the real wavefunction of dtype={dtype_name} cannot follow; use dtype=complex128")


def _warn_on_signs(model, hilbert, hamiltonian, dtype_name, excited_states: bool):
    """Warns when a model whose log psi is real (real parameters, and no complex output layer or
    character to give it phases) meets a Hamiltonian that is not stoquastic, or is asked for excited
    states (which have nodes a positive psi cannot have)."""
    if dtype_name not in REAL:
        return
    if excited_states and not _complex_log_psi(model, hilbert):
        logging.warning("dtype=%s gives this model a real, sign-free wavefunction, which cannot represent excited "
                        "states (they have nodes); consider dtype=complex128", dtype_name)
        return
    if pauli.is_stoquastic(hamiltonian):
        return
    if _complex_log_psi(model, hilbert):
        return
    logging.warning(
        "dtype=%s gives this model a real, sign-free wavefunction, but this Hamiltonian is not stoquastic "
        "(positive or complex off-diagonal elements), so its ground state may have signs it cannot represent; "
        "consider dtype=complex128", dtype_name,
    )
