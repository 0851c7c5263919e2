"""K states of one model as one wavefunction of K configurations: the determinant of natural
excited states (NES-VMC, Pfau, Axelrod, Sutterud, von Glehn and Spencer, Science 2024)."""

import flax.linen as nn
import jax
import jax.numpy as jnp

from models import small_linalg
from runner.errors import ConfigError


def _each(module, sigma_xN):
    return module(sigma_xN)


class Determinant(nn.Module):
    """Psi(x_1, ..., x_K) = det[psi_i(x_j)]: K states psi_i of the model `base`, each with its own
    parameters, evaluated on K configurations of its N sites laid side by side (K N sites).

    The determinant is antisymmetric under exchanging two configurations, so the lowest energy of
    sum_j H_j (H acting on the j-th configuration) it can reach is E_0 + ... + E_{K-1}, at
    psi_1..psi_K spanning the K lowest states; `runner.core.excited` reads the single energies
    from the matrix (H Psi) Psi^{-1}. log Psi is complex even for a real base model (a negative
    determinant has phase pi).
    """

    base: nn.Module
    """The model of one state (spins [..., N] -> log psi [...])."""
    n_states: int = 2
    """K, the number of states."""

    def __post_init__(self):
        if isinstance(self.n_states, bool) or not isinstance(self.n_states, int) or self.n_states < 1:
            raise ConfigError("n_states", f"must be a positive integer (got {self.n_states!r})")
        super().__post_init__()

    @property
    def holomorphic(self) -> bool:
        """log det is holomorphic in the parameters where each log psi_i is."""
        return getattr(self.base, "holomorphic", False)

    @nn.compact
    def each(self, sigma_xN):
        """log psi_i(sigma) of every state [..., K] at configurations of one copy [..., N]."""
        states = nn.vmap(_each, variable_axes={"params": 0}, split_rngs={"params": True}, in_axes=None,
                         out_axes=-1, axis_size=self.n_states)
        return states(self.base, sigma_xN)

    def matrix(self, sigma_xM):
        """L [..., K, K] with L_ij = log psi_i(x_j), from the K configurations x_j of sigma [..., K N]."""
        x_xKxN = sigma_xM.reshape(*sigma_xM.shape[:-1], self.n_states, -1)
        return jnp.swapaxes(self.each(x_xKxN), -1, -2)

    def __call__(self, sigma_xM):
        """log det[psi_i(x_j)] [...], complex."""
        return log_det_exp(self.matrix(sigma_xM))


def log_det_exp(L_xKxK):
    """log det exp(L) (elementwise exp) [...], complex: each row is scaled by its largest |entry|
    first, so the determinant of amplitudes far from 1 neither overflows nor underflows."""
    r_xK = jax.lax.stop_gradient(jnp.max(jnp.real(L_xKxK), axis=-1))
    r_xK = jnp.where(jnp.isfinite(r_xK), r_xK, 0.0)
    return jnp.sum(r_xK, axis=-1) + small_linalg.log_det(jnp.exp(L_xKxK - r_xK[..., None]))
