"""vmc-runner: Hydra-configured variational Monte Carlo for neural quantum states in JAX."""
