"""Flax wavefunctions: each maps spins [..., N] (+-1) to log psi [...]."""

from models.cnn import CNN
from models.gcnn import GCNN
from models.jastrow import Jastrow
from models.mlp import MLP
from models.rbm import RBM
from models.rbm_symm import RBMSymm
from models.vit import ViT

__all__ = ["RBM", "RBMSymm", "CNN", "GCNN", "ViT", "Jastrow", "MLP"]
