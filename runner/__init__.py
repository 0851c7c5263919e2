"""vmc-runner: Hydra-configured variational Monte Carlo for neural quantum states in JAX."""


def load(run_dir):
    """The trained state of a run directory: `.config`, `.params`, `.log_psi(sigma)`,
    `.sample(n)`, `.expect(name or Pauli terms)`, `.metrics` (see `runner.api.load`).

    Imported on first use, so `import runner` stays light (the CLI configures JAX first).
    """
    from runner.api import load as _load

    return _load(run_dir)


def run(overrides=(), run_dir=None, quiet=False):
    """Runs one experiment from Python, as `python -m runner OVERRIDES` does, and returns its
    trained state (`runner.load`'s object). It logs as the CLI: the progress and health warnings
    to stderr (none with `quiet=True`) and RUN_DIR/cli.log, through Python's logging, for the
    duration of the call. A bad config raises `runner.errors.ConfigError`.

    Imported on first use, like `load`.
    """
    from runner.api import run as _run

    return _run(overrides, run_dir, quiet=quiet)
