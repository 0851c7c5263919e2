"""A run's life: its directory, training loop, finishing work, checkpoints, stop signals, warm starts and searches."""
