"""Projected time-dependent VMC (ptVMC; Sinibaldi, Giuliani, Carleo and Vicentini, Quantum 7, 1131
(2023)): each time step is an optimisation, not an integration of the TDVP.

A step of dt maps the parameters theta to the phi that minimise the infidelity
I(phi) = 1 - |<Phi|Psi>|^2 / (<Phi|Phi> <Psi|Psi>) between Phi = (1 + a H) psi_phi and
Psi = (1 - a H) psi_theta, a = i dt/2 (real time) or dt/2 (imaginary time): the midpoint
(Crank-Nicolson, Pade (1, 1)) rule psi_phi = (1 + a H)^-1 (1 - a H) psi_theta, exp(-2 a H) to second
order in dt.

Estimates. x are samples of |psi_phi|^2 and y of |psi_theta|^2 (or a full sum's configurations with
their exact weights), reweighted to |Phi|^2 and |Psi|^2 by |1 + a E_loc^phi(x)|^2 and
|1 - a E_loc^theta(y)|^2 (Phi(x) / psi_phi(x) = 1 + a E_loc^phi(x)). With H(x) = Psi(x) / Phi(x) and
G(y) = Phi(y) / Psi(y), F = E_x[H] E_y[G]; the paper's control variate adds
-1/2 (E_x[|H|^2] E_y[|G|^2] - 1), of mean zero (the product is 1 exactly), which cancels the
first-order fluctuations of the estimate as F -> 1:

    F_CV = Re(E_x[H] E_y[G]) - (E_x[|H|^2] E_y[|G|^2] - 1) / 2,    I = 1 - F_CV,

exact for a full sum. With D_k(x) = d log Phi(x) / d phi_k (the log-derivatives of psi_phi plus those
of log(1 + a E_loc^phi(x))), d log F / d conj(phi_k) = E_x[conj(D_k - <D_k>) (H - <H>)] / E_x[H]:
zero sample by sample once Phi is proportional to Psi. Each iteration solves the natural-gradient
(Gauss-Newton) equation S delta = that gradient, S the metric of the D_k under |Phi|^2 (the TDVP's
and SR's S, `runner.core.sr`), regularised as the TDVP's solve, and moves phi by
learning_rate * delta; in real coordinates (real parameters, or a non-holomorphic model's split
complex ones) Re S and the real part of the gradient, as the TDVP.
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from runner.core.integrators import IntegratorState
from runner.core.jacobian import centred
from runner.core.local_energy import local_energies, local_energy, map_over_samples
from runner.core.problem import Problem, draw
from runner.core.sr import gram_and_force
from runner.core.stats import weighted_mean
from runner.core.tdvp import TDVP, regularised_inverse
from runner.core.wavefunction import from_split, gradient_mode, ratio_of, to_split
from runner.core.weights import normalised_weights
from runner.errors import ConfigError, require_bool, require_int, require_number


class PTVMC(NamedTuple):
    """A projected time step's settings (`ptvmc` checks them; see the module docstring)."""

    dt: float
    max_iterations: int
    tolerance: float
    learning_rate: float
    diag_shift: float
    rcond: float
    extrapolate: bool

    def init(self, t0, y0, carry=()) -> IntegratorState:
        """`runner.core.integrators.init` for a projected step: `init`."""
        return init(self, t0, y0, carry)


def ptvmc(dt: float, *, max_iterations: int = 10, tolerance: float = 1e-9, learning_rate: float = 1.0,
          diag_shift: float = 0.0, rcond: float = 1e-8, extrapolate: bool = True) -> PTVMC:
    """Projected tVMC, checked. `dt`: the step. `max_iterations`: natural-gradient updates per step
    at most. `tolerance`: a step stops once its infidelity estimate is at most this, or
    fell by at most this in an update. `learning_rate`:
    the update's factor (1: the Gauss-Newton step). `diag_shift`, `rcond`: the solve's shift of S and
    soft cut-off of its eigenvalues. `extrapolate`: start from theta + dt * the previous step's
    (phi - theta) / dt (false: from theta)."""
    dt = require_number("dt", dt, positive=True)
    max_iterations = require_int("max_iterations", max_iterations, minimum=1)
    tolerance = require_number("tolerance", tolerance, nonnegative=True)
    learning_rate = require_number("learning_rate", learning_rate, positive=True)
    diag_shift = require_number("diag_shift", diag_shift, nonnegative=True)
    rcond = require_number("rcond", rcond, nonnegative=True)
    if not rcond < 1:
        raise ConfigError("rcond", f"must be below 1 (got {rcond})")
    return PTVMC(dt, max_iterations, tolerance, learning_rate, diag_shift, rcond,
                 require_bool("extrapolate", extrapolate))


class Memory(NamedTuple):
    """What a projected step leaves for the next and for the record (the `IntegratorState`'s k0)."""

    velocity: Any  # (phi - theta) / dt of the last step, like the parameters; zero before the first
    infidelity: jax.Array  # the last step's final estimate of I; NaN before the first
    iterations: jax.Array  # int32: natural-gradient updates over every step so far


class Target(NamedTuple):
    """Psi = (1 - c H) psi_theta on the samples y of |psi_theta|^2, fixed for a step."""

    coefficient: jax.Array  # c: i dt/2 (real time) or dt/2, of Phi = (1 + c H) psi_phi and Psi
    sigma_CxTxN: jax.Array
    w_CxT: jax.Array  # the weights of |Psi|^2, summing to 1
    log_Psi_CxT: jax.Array


class Estimate(NamedTuple):
    """One iteration's estimates at phi."""

    infidelity: jax.Array  # 1 - F_CV
    step: Any  # the natural-gradient update delta (before learning_rate), like the parameters
    gradient: Any  # dI/dRe(phi) + i dI/dIm(phi) (dI/dphi for real parameters), like the parameters


def init(method: PTVMC, t0, y0, carry=()) -> IntegratorState:
    """The state at time t0 with parameters y0 (k0: a zero `Memory`)."""
    t0 = jnp.asarray(t0, jnp.result_type(float))
    real = _real_dtype(y0)
    memory = Memory(jax.tree_util.tree_map(jnp.zeros_like, y0), jnp.asarray(jnp.nan, real), jnp.zeros((), jnp.int32))
    zero = jnp.zeros((), jnp.int32)
    return jax.tree_util.tree_map(jnp.asarray, IntegratorState(t0, jnp.asarray(method.dt, t0.dtype), memory, carry,
                                                               zero, zero))


def _real_dtype(params):
    return jnp.finfo(jax.tree_util.tree_leaves(params)[0].dtype).dtype


def _log_one_plus(coefficient, eloc):
    """log(1 + c E_loc), complex (1 + c E_loc may be a negative real number in imaginary time)."""
    return jnp.log((1 + coefficient * eloc).astype(jnp.result_type(coefficient, eloc, jnp.complex64)))


def log_factor(problem: Problem, params, sigma_CxTxN, coefficient):
    """log(1 + c E_loc) [C, T], complex: log of (1 + c H) psi over psi on each sample."""
    return _log_one_plus(coefficient, local_energies(problem, params, sigma_CxTxN))


def _reweighted(w_CxT, log_factor_CxT):
    """The weights of |(1 + c H) psi|^2 from samples of |psi|^2 (w None: equal) or weights w."""
    log_w_CxT = 2 * jnp.real(log_factor_CxT)
    if w_CxT is not None:
        log_w_CxT = jnp.where(w_CxT > 0, jnp.log(jnp.where(w_CxT > 0, w_CxT, 1.0)) + log_w_CxT, -jnp.inf)
    return normalised_weights(log_w_CxT)


def target(problem: Problem, theta, coefficient, sigma_CxTxN, w_CxT=None) -> Target:
    """Psi = (1 - c H) psi_theta on samples of |psi_theta|^2 (w None) or a full sum's (w its weights)."""
    log_v_CxT = log_factor(problem, theta, sigma_CxTxN, -coefficient)
    return Target(coefficient, sigma_CxTxN, _reweighted(w_CxT, log_v_CxT),
                  problem.logpsi(theta, sigma_CxTxN) + log_v_CxT)


def _fidelity(log_H_CxT, w_CxT, log_G_CxT, v_CxT):
    """(F_CV, H / scale, E_x[H] / scale) from log H on x (weights w) and log G on y (weights v),
    scaled by a common factor that leaves F_CV unchanged and keeps the exponentials finite."""
    scale = weighted_mean(jnp.real(log_H_CxT), w_CxT)
    H_CxT, G_CxT = jnp.exp(log_H_CxT - scale), jnp.exp(log_G_CxT + scale)
    mean_H, mean_G = weighted_mean(H_CxT, w_CxT), weighted_mean(G_CxT, v_CxT)
    square = weighted_mean(jnp.abs(H_CxT) ** 2, w_CxT) * weighted_mean(jnp.abs(G_CxT) ** 2, v_CxT)
    return jnp.real(mean_H * mean_G) - (square - 1) / 2, H_CxT, mean_H


def log_derivatives(problem: Problem, params, sigma_CxTxN, coefficient, mode):
    """D = d log Phi / d phi [C, T, P], log Phi = log psi + log(1 + c E_loc), in the coordinates of
    `mode` (`runner.core.jacobian.log_derivatives`'s)."""
    flat, unravel = ravel_pytree(params)
    to_params = unravel
    if mode == "split":
        flat, to_params = to_split(flat), lambda v: unravel(from_split(v))
    ratio_fn = ratio_of(problem.model)

    def log_phi(v, sigma_N):
        p = to_params(v)
        eloc = local_energy(problem.hamiltonian, problem.logpsi, p, sigma_N, ratio_fn)
        return problem.logpsi(p, sigma_N) + _log_one_plus(coefficient, eloc)

    if mode == "holomorphic":
        grad = jax.grad(log_phi, holomorphic=True)
    else:
        re, im = jax.grad(lambda v, s: jnp.real(log_phi(v, s))), jax.grad(lambda v, s: jnp.imag(log_phi(v, s)))
        grad = lambda v, s: re(v, s) + 1j * im(v, s)  # noqa: E731
    per_sample = jax.vmap(jax.vmap(grad, in_axes=(None, 0)), in_axes=(None, 0))
    return map_over_samples(lambda sigma: per_sample(flat, sigma), sigma_CxTxN, problem.chunk_per_chain)


def estimate(problem: Problem, method: PTVMC, phi, theta, sample, psi: Target) -> Estimate:
    """The infidelity, its gradient and the natural-gradient update at phi (module docstring).

    Args:
        problem: its Hamiltonian, model and chunk size.
        method: the solve's diag_shift and rcond.
        phi, theta: the parameters optimised and those of the step's start.
        sample: (sigma [C, T, N], w [C, T] or None) of |psi_phi|^2 (`runner.core.problem.draw`).
        psi: Psi = (1 - c H) psi_theta on the samples of |psi_theta|^2, and c (`target`).
    """
    sigma_CxTxN, w0_CxT = sample
    coefficient = psi.coefficient
    log_u_CxT = log_factor(problem, phi, sigma_CxTxN, coefficient)
    w_CxT = _reweighted(w0_CxT, log_u_CxT)
    log_Psi_CxT = problem.logpsi(theta, sigma_CxTxN) + log_factor(problem, theta, sigma_CxTxN, -coefficient)
    log_Phi_y = problem.logpsi(phi, psi.sigma_CxTxN) + log_factor(problem, phi, psi.sigma_CxTxN, coefficient)
    fidelity, H_CxT, mean_H = _fidelity(log_Psi_CxT - problem.logpsi(phi, sigma_CxTxN) - log_u_CxT, w_CxT,
                                        log_Phi_y - psi.log_Psi_CxT, psi.w_CxT)
    mode = gradient_mode(phi, problem.model)
    D_CxTxP = log_derivatives(problem, phi, sigma_CxTxN, coefficient, mode)
    C, T = sigma_CxTxN.shape[:2]
    Dbar_PxS = centred(D_CxTxP, w_CxT).reshape(C * T, -1).T
    # force / 2: d log F / d conj(phi) (holomorphic); half of d log F / d phi (real coordinates).
    S_PxP, force_P = gram_and_force(Dbar_PxS, (centred(H_CxT, w_CxT) / mean_H).reshape(-1),
                                     "real" if mode == "split" else mode, C)
    rhs_P = force_P / 2
    lambda_P, V_PxP = jnp.linalg.eigh(S_PxP + method.diag_shift * jnp.eye(S_PxP.shape[0], dtype=S_PxP.dtype))
    inverse_P = regularised_inverse(lambda_P, jnp.full(lambda_P.shape, jnp.inf, lambda_P.dtype),
                                     TDVP(rcond=method.rcond))
    delta_P = V_PxP @ (inverse_P * (jnp.conj(V_PxP).T @ rhs_P))
    flat, unravel = ravel_pytree(phi)
    as_tree = lambda x: unravel((from_split(x) if mode == "split" else x).astype(flat.dtype))  # noqa: E731
    return Estimate(1 - fidelity, as_tree(delta_P), as_tree(-2 * fidelity * rhs_P))


def _coefficient(dt, real_time: bool, params):
    """c = i dt/2 (real time) or dt/2, complex in the parameters' precision."""
    real = _real_dtype(params)
    return (jnp.asarray(dt, real) / 2).astype(jnp.result_type(real, jnp.complex64)) * (1j if real_time else 1)


def _optimise(problem: Problem, method: PTVMC, theta, phi, chains, psi: Target):
    """(phi, chains, updates, final infidelity, converged): natural-gradient updates from phi until
    the infidelity estimate is at most the tolerance or fell by at most the tolerance in the last
    update (converged: the ansatz's floor), or after max_iterations updates, towards `psi`. An
    update after which the estimate rose by more than the tolerance, or is not finite, is undone
    and ends the step at the point before it (converged if that point's estimate is finite): with
    samples, an update too long for the noise in S can land where the samples of |psi_phi|^2 no
    longer see the target's weight. Each iteration draws its samples of |psi_phi|^2."""

    def body(loop):
        phi, before, chains, n, previous, _, _ = loop
        chains, sigma_CxTxN, w_CxT, _ = draw(problem, phi, chains)
        found = estimate(problem, method, phi, theta, (sigma_CxTxN, w_CxT), psi)
        rose = ~(found.infidelity <= previous + method.tolerance)
        infidelity = jnp.where(rose, previous, found.infidelity)
        converged = jnp.where(rose, jnp.isfinite(previous),
                              (found.infidelity <= method.tolerance) | (previous - found.infidelity <= method.tolerance))
        stop = rose | converged | (n >= method.max_iterations)
        rate = lambda p: jnp.asarray(method.learning_rate, _real_dtype(p))  # noqa: E731
        moved = jax.tree_util.tree_map(lambda p, b, d: jnp.where(rose, b, jnp.where(stop, p, p + rate(p) * d)),
                                       phi, before, found.step)
        return moved, phi, chains, n + (~stop).astype(jnp.int32), infidelity, converged, stop

    no = jnp.zeros((), bool)
    start = (phi, phi, chains, jnp.zeros((), jnp.int32), jnp.asarray(jnp.inf, _real_dtype(phi)), no, no)
    phi, _, chains, n, infidelity, converged, _ = jax.lax.while_loop(lambda loop: ~loop[6], body, start)
    return phi, chains, n, infidelity, converged


def step(problem: Problem, method: PTVMC, real_time: bool, y, state: IntegratorState, t_end):
    """One projected step from state.t (shortened to land on t_end as `runner.core.integrators.step`
    does): (phi, state), the chains advanced by every draw, n_rejected counting a step whose
    optimisation stopped at max_iterations unconverged (`_optimise`; the step is kept)."""
    t_end = jnp.asarray(t_end, state.t.dtype)
    last = t_end - state.t <= state.dt * (1 + 1e-9)
    dt = jnp.where(last, t_end - state.t, state.dt)
    real = _real_dtype(y)
    chains, sigma_CxTxN, w_CxT, _ = draw(problem, y, state.carry)
    psi = target(problem, y, _coefficient(dt, real_time, y), sigma_CxTxN, w_CxT)
    phi = y
    if method.extrapolate:
        phi = jax.tree_util.tree_map(lambda p, v: p + jnp.asarray(dt, real) * v, y, state.k0.velocity)
    phi, chains, n, infidelity, converged = _optimise(problem, method, y, phi, chains, psi)
    velocity = jax.tree_util.tree_map(lambda a, b: (a - b) / jnp.asarray(dt, real), phi, y)
    memory = Memory(velocity, infidelity, state.k0.iterations + n)
    return phi, IntegratorState(jnp.where(last, t_end, state.t + dt), state.dt, memory, chains,
                                state.n_accepted + 1, state.n_rejected + (~converged).astype(jnp.int32))


def advance(problem: Problem, method: PTVMC, real_time: bool, y, state: IntegratorState, t_end, *,
            max_steps: int = 100_000):
    """(y, state) at t_end by projected steps in a `lax.while_loop` (t_end traced: one compilation
    for every end time), as `runner.core.integrators.advance`; stops early after `max_steps` steps."""
    t_end = jnp.asarray(t_end, state.t.dtype)

    def body(loop):
        y, state, n = loop
        return (*step(problem, method, real_time, y, state, t_end), n + 1)

    y, state, _ = jax.lax.while_loop(lambda loop: (loop[1].t < t_end) & (loop[2] < max_steps), body, (y, state, 0))
    return y, state
