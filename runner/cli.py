"""The Hydra entry point, kept thin: configure the process, compose, hand over to `app.run`."""

import contextlib
import logging
import os
import sys
import time
from pathlib import Path

from runner.config import compose
from runner.errors import ConfigError, RunEnded, RunFailed
from runner.lifecycle.hparams_search import quiet_storage_logs
from runner.lifecycle.preemption import EXIT_INTERRUPTED, exit_status
from runner.parallel.runtime import configure_runtime

CONF_DIR = compose.CONF_DIR
# Hydra's flags that compose another config than conf/config.yaml
OTHER_CONFIG = {"-cn", "--config-name", "-cp", "--config-path", "-cd", "--config-dir"}
# The CLI's log, RUN_DIR/cli.log: Hydra's job log (hydra/job_logging: default), named after the job,
# which Hydra names after the file of the `@hydra.main` function, this one. `runner.run` writes the same.
LOG_FILE = f"{Path(__file__).stem}.log"
LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"  # Hydra's default job_logging format


def check_overrides(argv):
    """Refuses the overrides of a command line (its `-m`-style flags left out) that choose a missing
    option or set a key the composed config does not have, naming the nearest valid names: what
    `python -m runner` checks before Hydra runs the job (`runner.config.compose.check_overrides`,
    against the composition Hydra gives).

    Raises:
        ConfigError: its str() is the one sentence (`runner.run` raises it; the CLI prints it, exit 2).
    """
    if any(arg.split("=")[0] in OTHER_CONFIG for arg in argv):
        return  # another primary config than conf/config.yaml: Hydra's own errors
    compose.check_overrides([arg for arg in argv if not arg.startswith("-") and ("=" in arg or arg.startswith("~"))])


def refuse_bad_overrides(argv):
    """`check_overrides` for a command: its sentence printed, exit 2."""
    try:
        check_overrides(argv)
    except ConfigError as err:
        print(f"Config error: {err}", file=sys.stderr)
        sys.exit(2)


@contextlib.contextmanager
def exits():
    """The run's typed errors as process exit statuses, here in the entry point only: a config
    error's sentence and 2, a distributed set-up that failed 1, a failed run 1, a stopped one 3
    (130 for Ctrl-C). With several processes any failure exits at once: Hydra would catch it and
    let this process exit 0 while its peers wait in a collective, where the launcher
    (KillOnBadExit) ends the step when one exits 1."""
    from runner.parallel import distributed

    try:
        yield
    except ConfigError as err:
        print(f"Config error: {err.sentence()}", file=sys.stderr)
        sys.exit(2)
    except distributed.DistributedInitError as err:
        print(err, file=sys.stderr)
        sys.exit(1)
    except RunEnded as ended:
        if ended.__cause__ is not None and distributed.process_count() > 1:  # an exception, maybe on this rank alone
            logging.shutdown()
            os._exit(1)
        sys.exit(1 if isinstance(ended, RunFailed) else exit_status(ended.status))
    except Exception:
        if distributed.process_count() > 1:
            logging.shutdown()
            os._exit(1)
        raise


def run_id(env=None) -> str:
    """The default run directory name: the same on every rank of one job.

    Under SLURM it is the job id (and array task), which all tasks of `srun` share; a
    per-process timestamp could differ between ranks by a second. Elsewhere: date/time.
    """
    env = os.environ if env is None else env
    if env.get("SLURM_JOB_ID"):
        array = env.get("SLURM_ARRAY_TASK_ID")
        return f"slurm-{env['SLURM_JOB_ID']}" + (f"_{array}" if array else "")
    return time.strftime("%Y-%m-%d/%H-%M-%S")


def new_dirs(argv, run_id_value: str, cwd=None) -> set[Path]:
    """The directories a single run may be given that do not exist yet, with their missing parents.

    Hydra creates the run directory before the run starts; a run that stops at a config error
    removes it again only if it is one of these (the default `outputs/RUN_ID` or a
    `hydra.run.dir=` override), so a directory that existed before is never removed.
    """
    cwd = Path.cwd() if cwd is None else Path(cwd)
    candidates = [cwd / "outputs" / run_id_value]
    candidates += [cwd / arg.partition("=")[2] for arg in argv if arg.startswith("hydra.run.dir=")]
    missing = set()
    for path in candidates:
        path = path.resolve()
        while not path.exists():
            missing.add(path)
            path = path.parent
    return missing


def main():
    configure_runtime()
    quiet_storage_logs()  # an Optuna search's store set-up, logged when Hydra loads the sweeper
    refuse_bad_overrides(sys.argv[1:])
    import hydra
    from omegaconf import OmegaConf

    run_id_value = run_id()
    if not OmegaConf.has_resolver("vmc_run_id"):
        OmegaConf.register_new_resolver("vmc_run_id", lambda: run_id_value, use_cache=True)
    created = new_dirs(sys.argv[1:], run_id_value)

    from runner import app

    entered, results = [], []

    @hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
    def _main(cfg):
        entered.append(True)
        with exits():
            results.append(app.run(cfg, new_dirs=created))
        return results[-1]

    try:
        _main()
    except SystemExit as exc:
        # Hydra exits with 1 when it cannot compose the config (an unknown key, a bad
        # override): that is a config error, status 2. Failures inside a run keep theirs.
        if exc.code == 1 and not entered:
            sys.exit(2)
        raise
    except KeyboardInterrupt:
        # Ctrl-C outside the run's handlers (composing the config, or after the run); a second
        # Ctrl-C during the run exits from the handler itself
        print("Interrupted: stopped at once; checkpoints already written are kept.", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    if any(isinstance(r, dict) and r.get("status") == "failed" for r in results):
        # a multirun recorded a point's config error and went on with the rest of the sweep
        sys.exit(2)
