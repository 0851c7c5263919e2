"""Flax wavefunctions: each maps spins [..., N] (+-1) to log psi [...]."""

from models.jastrow import Jastrow
from models.mlp import MLP
from models.rbm import RBM

__all__ = ["RBM", "Jastrow", "MLP"]
