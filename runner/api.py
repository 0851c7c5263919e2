"""`runner.load(RUN_DIR)`: a trained run in Python: its config, parameters, log psi, samples, expectation values and metrics."""

import contextlib
import functools
import json
import logging
import sys
from pathlib import Path
from typing import NamedTuple

from runner.errors import ConfigError
from runner.lifecycle.excited import state_of
from runner.lifecycle.load import Trained, experiment_of, read_config
from runner.lifecycle.load import load as load_trained
from runner.lifecycle.ground_state import prints_to_terminal
from runner.lifecycle.rundir import METRICS, SUMMARY


class Estimate(NamedTuple):
    """A Monte Carlo estimate: `mean, error = run.expect(...)`."""

    mean: float
    error: float


class TrainedRun:
    """A run's checkpointed state on the default device (see `load`).

    Attributes:
        run_dir: the run directory.
        config: the resolved config the run was composed with (a plain dict).
        params: the model parameters (a pytree of jax arrays).
        step: the number of VMC steps the checkpoint holds (a time evolution's: the index of
            its last saved time).
        t: a time evolution's last saved time (task=dynamics), whose state `params` is; None
            for a ground-state run.
        hilbert, hamiltonian, model, sampler: the objects the run was built with (the
            Hamiltonian as simulated, i.e. after any sign rule).
    """

    def __init__(self, trained: Trained):
        import jax
        import jax.numpy as jnp

        from runner.core.estimate import final_burn_in

        self.run_dir = trained.run_dir
        self._trained = trained
        self.config = trained.config
        experiment = trained.experiment
        self._problem = experiment.problem
        # the space and Hamiltonian simulated: K copies and sum_j H_j for a task=excited run (see `state`)
        self.hilbert, self.hamiltonian = self._problem.sampler.hilbert, self._problem.hamiltonian
        self.model, self.sampler = self._problem.model, self._problem.sampler
        self.params = jax.tree_util.tree_map(jnp.asarray, trained.state.params)
        self.step = int(trained.meta["step"])
        self.t = trained.meta.get("t")
        self._chains = jax.tree_util.tree_map(jnp.asarray, trained.state.chains)
        self._burn_in_sweeps = final_burn_in(self.sampler)  # before the first draw (`_draw`)
        self._log_psi = jax.jit(self._problem.logpsi)
        self._statistics, self._samplers = {}, {}
        self._run_observables = experiment.observables

    def state(self, k: int) -> "TrainedRun":
        """Eigenstate k of a task=excited run (0 <= k < n_states), the level summary.json's
        `states[k]` reports: sum_j c_kj psi_j of the K trained states with the stored coefficients,
        on the model's own space; its log psi, samples and expectation values
        (`runner.lifecycle.excited.state_of`)."""
        return TrainedRun(state_of(self._trained, k))

    def __repr__(self):
        at = "" if self.t is None else f", t={self.t:g}"
        return f"TrainedRun({str(self.run_dir)!r}, step={self.step}{at}, n_sites={self.hilbert.n_sites})"

    @property
    def summary(self) -> dict | None:
        """The run's summary.json, or None when it has none."""
        path = Path(self.run_dir) / SUMMARY
        return json.loads(path.read_text()) if path.is_file() else None

    @property
    def metrics(self):
        """metrics.jsonl as a pandas DataFrame, one row per step."""
        import pandas as pd

        path = Path(self.run_dir) / METRICS
        lines = path.read_text().splitlines() if path.is_file() else []
        return pd.DataFrame([json.loads(line) for line in lines if line.strip()])

    def log_psi(self, sigma):
        """log psi of spin configurations.

        Args:
            sigma: +-1 spins [..., N] (any integer or float array).

        Returns:
            log psi [...] (complex for complex parameters).
        """
        import jax.numpy as jnp

        return self._log_psi(self.params, jnp.asarray(self._checked(sigma), jnp.int8))

    def local_energies(self, sigma):
        """E_loc = <sigma|H|psi> / <sigma|psi> of spin configurations, H as simulated (after
        any sign rule).

        Args:
            sigma: +-1 spins [K, N].

        Returns:
            NumPy E_loc [K] (complex for complex parameters).
        """
        from runner.core.local_energy import local_energies_of

        sigma = self._checked(sigma)
        if sigma.ndim != 2:
            raise ValueError(f"sigma must have shape [K, {self.hilbert.n_sites}] (got {list(sigma.shape)})")
        return local_energies_of(self._problem, self.params, sigma)

    def peak_check(self, n_samples: int | None = None, n_starts: int = 32, seed: int = 0) -> dict:
        """Looks for configurations with more |psi|^2 than every one of `n_samples` fresh samples
        (default: the run's n_samples), continuing the run's chains: `runner.diagnostics.peaks.check`, whose
        "wrong" says the samples cannot be from |psi|^2."""
        import numpy as np

        from runner.diagnostics import peaks

        n = n_samples or self.sampler.n_samples
        sampled = float(np.max(np.real(np.asarray(self.log_psi(self.sample(n))))))
        return peaks.check(self._problem, self.params, sampled, np.asarray(self._chains.sigma_CxN), n_starts, seed)

    def _checked(self, sigma):
        import numpy as np

        sigma = np.asarray(sigma)
        if sigma.ndim < 1 or sigma.shape[-1] != self.hilbert.n_sites:
            raise ValueError(f"sigma must have shape [..., {self.hilbert.n_sites}] (got {list(sigma.shape)})")
        if not np.all(np.abs(sigma) == 1):
            raise ValueError("sigma must hold spins +1 (up) and -1 (down)")
        return sigma

    def _sampler(self, n: int):
        import dataclasses

        from runner.core.full_sum import FullSumSampler
        from runner.core.sampler import _check_counts

        if isinstance(self.sampler, FullSumSampler):
            raise ValueError("this run sums over every configuration (sampler=full_sum) and draws no samples; "
                             "expect() gives exact values")
        _check_counts(n, self.sampler.n_chains)  # n must be a multiple of n_chains, >= 2 per chain
        return dataclasses.replace(self.sampler, n_samples=int(n))

    def _draw(self, n: int):
        """sigma [C, n / C, N], continuing the run's chains (each call gives new samples; the first
        after the run's final burn-in, `runner.core.estimate.final_burn_in`)."""
        import jax

        from runner.core.estimate import burn_in
        from runner.core.problem import VMCState
        from runner.core.sampler import sample

        if self._burn_in_sweeps:  # chains that sampled |psi|^p in training: the run's final burn-in first
            sweeps, self._burn_in_sweeps = self._burn_in_sweeps, 0
            state = VMCState(self.params, None, self._chains, None, None)
            self._chains = jax.jit(lambda s: burn_in(self._problem, s, sweeps))(state).chains
        if n not in self._samplers:  # one compiled sampler per sample count
            self._samplers[n] = jax.jit(functools.partial(sample, self._sampler(n), self._problem.amplitude))
        self._chains, sigma_CxTxN, _ = self._samplers[n](self.params, self._chains)
        return sigma_CxTxN

    def sample(self, n: int):
        """`n` configurations from |psi|^2 with the run's sampler, continuing its chains.

        Args:
            n: number of samples, a multiple of the run's `sampler.n_chains`.

        Returns:
            NumPy int8 spins [n, N], chain by chain.
        """
        import numpy as np

        return np.asarray(self._draw(n)).reshape(n, self.hilbert.n_sites)

    def _observables_for(self, observable):
        """The `runner.physics.observables.Observables` that measures `observable` (see `expect`), None
        for "energy"."""
        from runner.physics import observables, pauli

        if isinstance(observable, str):
            if observable == "energy":
                return None
            for obs in (self._run_observables, observables.spin(self.hilbert, self.hamiltonian)):
                if obs is not None and observable in obs.all_names:
                    return obs
            known = ["energy", *(self._run_observables.all_names if self._run_observables else ()),
                     *observables.SPIN_NAMES]
            raise KeyError(f"unknown observable {observable!r}; known: {', '.join(dict.fromkeys(known))}, "
                           "or a list of Pauli terms {coeff, ops, on}")
        if not isinstance(observable, pauli.PauliSum):
            observable = observables.pauli_terms(self.hilbert, "expression", list(observable))
        return observables.make(self.hilbert, self.hamiltonian, [("expression", observable)])

    def expect(self, observable, n_samples: int | None = None) -> Estimate:
        """<psi|O|psi> / <psi|psi> from `n_samples` fresh samples (default: the run's n_samples),
        continuing the run's chains.

        Args:
            observable: "energy"; a name of the run's observables or of the `spin` set
                (magnetization_x, magnetization_z, mz2, zz_nn, xx_nn, structure_factor_zz); a
                list of Pauli terms in the `pauli` Hamiltonian format ({coeff, ops, on}, in the
                user's original basis); or a `runner.physics.pauli.PauliSum` in that basis.
            n_samples: a multiple of the run's `sampler.n_chains` (not used after sampler=full_sum,
                whose values are exact sums over every configuration, error 0).

        Returns:
            Estimate(mean, error): the real part of the mean (O is Hermitian) and its error.
        """
        import jax

        from runner.core import observe
        from runner.core.full_sum import FullSumSampler

        obs = self._observables_for(observable)
        if isinstance(self.sampler, FullSumSampler):  # exact: every configuration, weighted by |psi|^2
            sigma_CxTxN, w_CxT = jax.jit(functools.partial(
                observe.every_configuration, self.sampler, self._problem.amplitude))(self.params)
        else:
            sigma_CxTxN, w_CxT = self._draw(n_samples or self.sampler.n_samples), None
        if obs is not None:
            value = observe.expect(obs, self._problem, self.params, sigma_CxTxN, w_CxT)[
                observable if isinstance(observable, str) else "expression"]
            return Estimate(value["mean"], value["error"])
        if "energy" not in self._statistics:  # one jitted function: it compiles once per sample count
            self._statistics["energy"] = _energy_statistics(self._problem)
        stats = self._statistics["energy"](self.params, sigma_CxTxN, w_CxT)
        return Estimate(float(jax.numpy.real(stats.mean)), float(stats.error_of_mean))


def _energy_statistics(problem):
    """(params, sigma [C, T, N] of |psi|^2 or a full sum's, its weights [C, T] or None) -> Stats of
    E_loc (jitted), by the runner's own `local_energies`, at most as many samples at once as
    the run's steps evaluated (`Problem.per_chain_at_once`; a last block that does not fill is
    padded): any `n_samples` fits in the memory the run needed."""
    import dataclasses

    import jax

    from runner.core import stats
    from runner.core.local_energy import local_energies

    chunked = dataclasses.replace(problem, chunk_size=problem.per_chain_at_once * problem.sampler.n_chains)
    return jax.jit(lambda params, sigma_CxTxN, w_CxT: stats.statistics(
        local_energies(chunked, params, sigma_CxTxN), w_CxT, True))


def run(overrides=(), run_dir=None, quiet=False) -> TrainedRun:
    """Runs an experiment from Python as `python -m runner OVERRIDES` does, and loads it.

    The config is composed from conf/ as the CLI composes it, its overrides checked as the CLI's
    (`runner.config.compose.compose`), and run by `runner.app.run`
    (skip, resume or start over, as the CLI would). Hydra's record of the composition
    (RUN_DIR/.hydra/config.yaml, overrides.yaml) is written as the CLI's Hydra writes it.

    It logs as the CLI does, through Python's logging, for the duration of the call (`_run_logging`):
    INFO and above (the header, the energy every tenth of the run, health warnings) appended to
    RUN_DIR/cli.log in the CLI's format and printed to stderr; the handlers are removed afterwards,
    so a second call prints nothing twice.

    Args:
        overrides: Hydra overrides, e.g. ["hilbert.L=8", "n_iter=20"] (no `hydra.` keys).
        run_dir: the run directory; None: outputs/<run id> under the working directory, as the CLI
            (`runner.cli.run_id`).
        quiet: print nothing to stderr (cli.log is written all the same). A handler of your own
            on the root logger that prints to stderr or stdout (`logging.basicConfig()`) takes
            the place of the stderr one: no line twice.

    Returns:
        `load(run_dir)` of the finished run.

    Raises:
        ConfigError: a bad config, with the sentence the CLI prints after "Config error: "
            (nothing is run and nothing is written), or a run directory or checkpoint this
            config cannot continue.
        RunFailed: the run failed (`.summary`: what it wrote to summary.json); the CLI exits 1.
        RunStopped: a stop signal stopped it after saving its checkpoint; the CLI exits 3 or 130.
    """
    from omegaconf import OmegaConf

    from runner import app, cli
    from runner.config import compose
    from runner.lifecycle import rundir
    from runner.parallel.runtime import configure_runtime

    configure_runtime()  # effective only if JAX has not started yet
    overrides = [str(o) for o in overrides]
    cfg = compose.compose(overrides)
    run_dir = Path(run_dir) if run_dir is not None else Path("outputs") / cli.run_id()
    with _run_logging(run_dir, quiet):
        app.run(cfg, run_dir=str(run_dir), overrides=overrides)  # a config error refuses before writing anything
    (run_dir / rundir.HYDRA).mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, run_dir / rundir.CONFIG, resolve=True)
    OmegaConf.save(OmegaConf.create(overrides), run_dir / rundir.OVERRIDES)
    return load(run_dir)


@contextlib.contextmanager
def _run_logging(run_dir: Path, quiet: bool):
    """The CLI's logging for one `run`: a handler appending INFO and above to RUN_DIR/cli.log
    (`runner.cli.LOG_FILE`, `LOG_FORMAT`: what Hydra's job logging writes) and, unless `quiet`,
    one printing them to stderr; the root logger at INFO meanwhile. Afterwards the handlers are
    removed and the root's level restored. A config error leaves no log (nor the directories
    it would have made): nothing is written before the config is valid."""
    from runner import cli
    from runner.lifecycle import rundir

    root = logging.getLogger()
    new = _missing_dirs(run_dir)  # what a config error removes again, as the CLI does
    log_path = run_dir / cli.LOG_FILE
    had_log = log_path.exists()
    formatter = logging.Formatter(cli.LOG_FORMAT)
    handlers = [_RunLog(log_path)]
    if not quiet and not any(prints_to_terminal(h) for h in root.handlers):
        handlers.append(logging.StreamHandler(sys.stderr))
    for handler in handlers:
        handler.setFormatter(formatter)
        handler.setLevel(logging.INFO)
        root.addHandler(handler)
    level = root.level
    root.setLevel(min(level, logging.INFO) if level != logging.NOTSET else logging.INFO)
    try:
        yield
    except ConfigError:
        handlers[0].close()
        if not had_log and log_path.is_file():  # its lines (warnings before the refusal) were printed too
            log_path.unlink()
        rundir.remove_if_new(run_dir, new)
        raise
    finally:
        root.setLevel(level)
        for handler in handlers:
            root.removeHandler(handler)
            handler.close()


def _missing_dirs(path: Path) -> set[Path]:
    """`path` and its parents that do not exist yet (resolved)."""
    path, missing = path.resolve(), set()
    while not path.exists():
        missing.add(path)
        path = path.parent
    return missing


class _RunLog(logging.FileHandler):
    """A FileHandler that opens RUN_DIR/cli.log on its first record, making the directory then."""

    def __init__(self, path: Path):
        super().__init__(path, mode="a", delay=True)

    def _open(self):
        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        return super()._open()


def load(run_dir) -> TrainedRun:
    """The trained state of a run directory, for a notebook.

    Enables 64-bit types when the run's dtype needs them (before its state is read).

    Args:
        run_dir: a run directory (with .hydra/ and checkpoint/).

    Returns:
        A TrainedRun: `.config`, `.params`, `.log_psi(sigma)`, `.local_energies(sigma)`,
        `.sample(n)`, `.expect(O)`, `.peak_check()`, `.metrics`.
    """
    from runner.parallel.runtime import configure_runtime

    configure_runtime()  # effective only if JAX has not started yet
    import jax

    config = read_config(run_dir)
    experiment = experiment_of(config)
    if experiment.x64:
        jax.config.update("jax_enable_x64", True)
    return TrainedRun(load_trained(run_dir, experiment))
