"""Configs composed from conf/ with Hydra's compose API, resolved to plain containers."""

from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

CONF = Path(__file__).resolve().parents[2] / "conf"

# A 2 x 2 kagome Heisenberg model in S^z = 0 with a small CNN (its symmetric sectors: model.sector).
KAGOME = ["hilbert=kagome", "hilbert.L=2", "hilbert.total_sz=0", "hamiltonian=heisenberg", "sampler=metropolis_exchange",
          "model=cnn", "model.channels=2"]

# The lattice models (symmetric RBM, CNN, ViT), small, as overrides: one VMC step on every layout
# (tests/models/test_models.py) and short runs to the exact energy (tests/integration/test_convergence.py).
LATTICE_CONFIGS = {"rbm_symm": ["model=rbm_symm"], "cnn": ["model=cnn", "model.channels=4"], "vit": ["model=vit"]}


def compose_config(overrides=()):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=True)
