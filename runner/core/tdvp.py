"""The time-dependent variational principle: the parameters' time derivative from one batch of
samples, regularised as Schmitt and Heyl do (PRL 125, 100503 (2020)), and its residual.

With O the log-derivatives and E_loc the local energies of the samples (weighted by a full sum's
or importance weights where given), S = <O* O> - <O*><O> and F = <O* E_loc> - <O*><E_loc>. The
TDVP picks the tangent vector O theta_dot closest to the exact one, -i (E_loc - E) in real time,
-(E_loc - E) in imaginary time (the centring leaves out the change of norm and global phase):

- holomorphic parameters: S theta_dot = -i F (real time), S theta_dot = -F (imaginary time);
- real parameters, log psi real or complex, and the real and imaginary parts of the complex
  parameters of a model that is not holomorphic (`runner.core.wavefunction.gradient_mode`
  "split"): Re[S] theta_dot = Re[-i F] = Im[F], Re[S] theta_dot = -Re[F].

The equation is solved in the eigenbasis of S + diag_shift = V diag(lambda) V^dagger: each
component of rho = V^dagger (the right-hand side) is divided by lambda_k and damped by
1 / (1 + (rcond lambda_max / lambda_k)^6) (a soft pseudo-inverse; eigenvalues below the
dtype's epsilon times lambda_max are dropped outright) and, with samples, by
1 / (1 + (snr_cutoff / SNR_k)^6), SNR_k = |rho_k| / (the standard error of rho_k as a mean of
per-sample contributions, the samples taken as independent).
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from runner.core import integrators
from runner.core.jacobian import centred, jacobian
from runner.core.local_energy import local_energies
from runner.core.problem import Problem, draw, sums_exactly
from runner.core.sr import gram_and_force
from runner.core.stats import Stats, chain_sum, statistics
from runner.core.wavefunction import from_split, gradient_mode
from runner.errors import ConfigError, require_bool, require_number


class TDVP(NamedTuple):
    """The equation of motion and its regularisation (see the module docstring)."""

    real_time: bool = True
    diag_shift: float = 0.0
    rcond: float = 1e-8
    snr_cutoff: float | None = None


def tdvp(*, real_time: bool = True, diag_shift: float = 0.0, rcond: float = 1e-8,
         snr_cutoff: float | None = None) -> TDVP:
    """The TDVP's settings, checked. `real_time`: -i H (else imaginary time, -H). `diag_shift`:
    added to S's diagonal before it is decomposed. `rcond`: the soft cut-off of S's eigenvalues
    relative to the largest. `snr_cutoff`: the signal-to-noise ratio below which a component in
    S's eigenbasis is damped; None: no damping (a full sum has no noise: never damped)."""
    require_bool("real_time", real_time)
    diag_shift = require_number("diag_shift", diag_shift, nonnegative=True)
    rcond = require_number("rcond", rcond, nonnegative=True)
    if not rcond < 1:
        raise ConfigError("rcond", f"must be below 1 (got {rcond})")
    if snr_cutoff is not None:
        snr_cutoff = require_number("snr_cutoff", snr_cutoff, positive=True)
    return TDVP(real_time, diag_shift, rcond, snr_cutoff)


class TDVPInfo(NamedTuple):
    """What one evaluation measured, for diagnostics."""

    energy: Stats  # of E_loc
    residual: jax.Array  # r^2: the distance of the chosen tangent vector from the exact one, over Var(E)
    eigenvalues_P: jax.Array  # of S + diag_shift, increasing
    snr_P: jax.Array  # SNR of rho in the same order; inf for a full sum


def parameter_derivative(problem: Problem, equation: TDVP, params, sigma_CxTxN, w_CxT=None):
    """theta_dot from the samples (all chains, one global array), and a `TDVPInfo`.

    Args:
        problem: its Hamiltonian, model, sampler (a full sum's weights are exact) and chunk size.
        equation: the `TDVP` settings.
        params: the parameters (a pytree; real, or complex).
        sigma_CxTxN: samples, C chains of T.
        w_CxT: their weights (`runner.core.problem.draw`), None for samples of |psi|^2.

    Returns:
        (theta_dot, info): theta_dot a pytree like params (for complex parameters dz/dt, whether
        solved holomorphically or split into real and imaginary parts).
    """
    eloc_CxT = local_energies(problem, params, sigma_CxTxN)
    exact = sums_exactly(problem)
    stats = statistics(eloc_CxT, w_CxT, exact=exact)
    mode = gradient_mode(params, problem.model)
    core_mode = "real" if mode == "split" else mode
    jac = jacobian(problem, params, sigma_CxTxN, mode, w_CxT)
    Obar_PxS = jac.dense()
    target_S = (-1j if equation.real_time else -1.0) * centred(eloc_CxT, w_CxT).reshape(-1)
    # force() is 2 Re(Obar^H target) (real coordinates) or 2 Obar^H target (holomorphic).
    S_PxP, force_P = gram_and_force(Obar_PxS, target_S, core_mode, jac.n_chains)
    rhs_P = force_P / 2
    lambda_P, V_PxP = jnp.linalg.eigh(S_PxP + equation.diag_shift * jnp.eye(S_PxP.shape[0], dtype=S_PxP.dtype))
    rho_P = jnp.conj(V_PxP).T @ rhs_P
    snr_P = jnp.full(lambda_P.shape, jnp.inf, lambda_P.dtype)
    if not exact:
        snr_P = _signal_to_noise(V_PxP, Obar_PxS, target_S, rho_P, jac.n_chains)
    x_P = V_PxP @ (regularised_inverse(lambda_P, snr_P, equation) * rho_P)
    residual = _residual(S_PxP, rhs_P, x_P, stats.variance)
    flat, unravel = ravel_pytree(params)
    x_P = from_split(x_P) if mode == "split" else x_P
    return unravel(x_P.astype(flat.dtype)), TDVPInfo(stats, residual, lambda_P, snr_P)


def regularised_inverse(lambda_P, snr_P, equation: TDVP):
    """1 / lambda_k, damped softly below rcond * lambda_max and below snr_cutoff (module
    docstring); 0 for eigenvalues under the dtype's epsilon times lambda_max."""
    top = jnp.maximum(lambda_P[-1], jnp.finfo(lambda_P.dtype).tiny)
    # Divided by an array, not a broadcast scalar: XLA rewrites x / broadcast(b) into
    # x * broadcast(1 / b) in some programs and not in others (1 against 2 devices), which changes bits.
    relative_P = lambda_P / jax.lax.optimization_barrier(jnp.broadcast_to(top, lambda_P.shape))
    kept_P = relative_P > jnp.finfo(lambda_P.dtype).eps
    safe_P = jnp.where(kept_P, relative_P, 1.0)
    damping_P = 1.0 / (1.0 + (equation.rcond / safe_P) ** 6)
    if equation.snr_cutoff is not None:
        damping_P = damping_P / (1.0 + (equation.snr_cutoff / snr_P) ** 6)
    return jnp.where(kept_P, damping_P / (safe_P * top), 0.0)


def _signal_to_noise(V_PxP, Obar_PxS, target_S, rho_P, n_chains):
    """SNR of each rho_k = sum_s r_ks, r_ks = (V^dagger conj(Obar_s) target_s)_k (real part in
    real coordinates), as the mean of the N per-sample estimates N r_ks: |rho_k| over
    sqrt(Var(N r_k) / N) = sqrt(sum_s |r_ks|^2 - |rho_k|^2 / N). Sums over samples go chain by
    chain (`chain_sum`), the same on every layout."""
    r_PxS = jnp.conj(V_PxP).T @ (jnp.conj(Obar_PxS) * target_S[None, :])
    if not jnp.iscomplexobj(rho_P):
        r_PxS = jnp.real(r_PxS)
    n_samples = r_PxS.shape[1]
    square_P = chain_sum(jnp.sum((jnp.abs(r_PxS) ** 2).reshape(r_PxS.shape[0], n_chains, -1), axis=2).T)
    error_P = jnp.sqrt(jnp.maximum(square_P - jnp.abs(rho_P) ** 2 / n_samples, 0.0))
    # No fluctuation at all (a component every sample gives as 0): nothing to damp.
    return jnp.where(error_P > 0, jnp.abs(rho_P) / jnp.where(error_P > 0, error_P, 1.0), jnp.inf)


def _residual(S_PxP, rhs_P, x_P, variance):
    """r^2 = |Obar x - target|^2 / Var(E) = 1 + (x^dagger S x - 2 Re x^dagger rhs) / Var(E), with
    the unshifted S; 0 when Var(E) is 0 (an eigenstate: nothing to follow)."""
    distance = jnp.real(jnp.vdot(x_P, S_PxP @ x_P)) - 2 * jnp.real(jnp.vdot(x_P, rhs_P))
    return jnp.where(variance > 0, 1.0 + distance / jnp.where(variance > 0, variance, 1.0), 0.0)


def time_derivative(problem: Problem, equation: TDVP):
    """f(t, params, chains) -> (theta_dot, chains) for `runner.core.integrators`: each
    evaluation draws its samples (`runner.core.problem.draw`; a full sum's are always the same)
    and solves the TDVP there. The Hamiltonian does not depend on t."""
    def f(t, params, chains):
        chains, sigma_CxTxN, w_CxT, _ = draw(problem, params, chains)
        return parameter_derivative(problem, equation, params, sigma_CxTxN, w_CxT)[0], chains

    return f


class DynamicsState(NamedTuple):
    """Everything a time evolution needs to continue exactly: the parameters and the integrator's
    state (t, dt, the FSAL stage, counts), whose carry is the Markov chains."""

    params: Any
    integrator: integrators.IntegratorState


def start(integrator: integrators.Integrator, f, params, chains) -> DynamicsState:
    """The state of a time evolution at t = 0 from `params` and `chains`; `f`: its time derivative
    (`time_derivative`), which a FSAL integrator evaluates there."""
    return DynamicsState(params, integrators.init(integrator, f, 0.0, params, chains))
