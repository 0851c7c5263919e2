"""The Hydra entry point, kept thin: configure the process, compose, hand over to `app.run`."""

import difflib
import os
import sys
import time
from pathlib import Path

from runner.config import fingerprint
from runner.errors import ConfigError
from runner.lifecycle.hparams_search import quiet_storage_logs
from runner.lifecycle.preemption import EXIT_INTERRUPTED
from runner.parallel.runtime import configure_runtime

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")
# The CLI's log, RUN_DIR/cli.log: Hydra's job log (hydra/job_logging: default), named after the job,
# which Hydra names after the file of the `@hydra.main` function, this one. `runner.run` writes the same.
LOG_FILE = f"{Path(__file__).stem}.log"
LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"  # Hydra's default job_logging format


def check_overrides(argv):
    """Refuses `group=option` overrides naming a missing option, and overrides whose group or key
    does not exist (a typo), naming the nearest valid names; what `python -m runner` checks before
    Hydra composes (Hydra would print several lines, or suggest `+key`, which the runner refuses).

    Raises:
        ConfigError: its str() is the one sentence (`runner.run` raises it; the CLI prints it, exit 2).
    """
    _group_choices(argv)
    _key_names(argv)


def refuse_bad_overrides(argv):
    """`check_overrides` for a command: its sentence printed, exit 2."""
    try:
        check_overrides(argv)
    except ConfigError as err:
        print(f"Config error: {err}", file=sys.stderr)
        sys.exit(2)


def _group_choices(argv):
    conf = Path(CONF_DIR)
    for arg in argv:
        if "=" not in arg or arg.startswith(("-", "+", "~", "hydra")):
            continue
        key, _, value = arg.partition("=")
        group = conf / key
        if "." in key or not group.is_dir():
            continue
        options = sorted(p.stem for p in group.glob("*.yaml"))
        for choice in value.strip("[]").split(","):  # a sweep a,b or a list [a,b] (logger=[jsonl,mlflow])
            if choice not in options:
                raise ConfigError(f"{key}={choice}", f"is not an option; choose one of: {', '.join(options)}.")


def _nearest(name: str, names) -> str:
    close = difflib.get_close_matches(name, sorted(names), n=3, cutoff=0.6)
    return f"did you mean {' or '.join(close)}?" if close else f"valid names: {', '.join(sorted(names))}."


def _choices(argv) -> dict:
    """{group: chosen option}: the config's defaults, then `group=option` overrides."""
    import yaml

    chosen = {}
    for entry in yaml.safe_load((Path(CONF_DIR) / "config.yaml").read_text())["defaults"]:
        if isinstance(entry, dict):
            chosen.update({k: v for k, v in entry.items() if isinstance(v, str)})
    picked = {}
    for arg in argv:
        key, _, value = arg.partition("=")
        if (Path(CONF_DIR) / key).is_dir() and "," not in value:
            picked[key] = value
    # An experiment's `override /group: option` entries come before the command line's choices.
    experiment = Path(CONF_DIR) / "experiment" / f"{picked.get('experiment')}.yaml"
    if experiment.is_file():
        for entry in (yaml.safe_load(experiment.read_text()) or {}).get("defaults", []):
            if isinstance(entry, dict):
                chosen.update({k.removeprefix("override /"): v for k, v in entry.items() if isinstance(v, str)})
    return {**chosen, **picked}


def _key_names(argv):
    import yaml

    conf = Path(CONF_DIR)
    top = yaml.safe_load((conf / "config.yaml").read_text())
    groups = {p.name for p in conf.iterdir() if p.is_dir()} - {"hydra"}
    chosen = _choices(argv)
    for arg in argv:
        if "=" not in arg or arg.startswith(("-", "+", "~", "hydra")):
            continue
        key = arg.partition("=")[0]
        head, _, rest = key.partition(".")
        if head not in groups and head not in top:
            raise ConfigError(head, f"is not a config group or top-level key; "
                                    f"{_nearest(head, groups | set(top) - {'defaults'})}")
        option = chosen.get(head)
        if not rest or head not in groups or not option or option == "null":
            continue
        node = _option_node(head, option)
        sub = rest.partition(".")[0]
        if isinstance(node, dict) and node and sub not in node:
            instead = fingerprint.RETIRED_BY.get(f"{head}.{sub}")  # an old key: what replaced it
            raise ConfigError(f"{head}.{sub}", f"is not a key of {head}={option}; "
                                               f"{instead or _nearest(sub, set(node) - {'_target_'})}")


def _option_node(group: str, option: str, seen=()) -> dict:
    """conf/GROUP/OPTION.yaml's keys, with those of the options of the same group its defaults
    list extends (e.g. sampler=full_sum_lattice: full_sum's keys and its own symmetry)."""
    import yaml

    path = Path(CONF_DIR) / group / f"{option}.yaml"
    node = (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}
    if not isinstance(node, dict):
        return node
    merged = {}
    for entry in node.pop("defaults", None) or []:
        if isinstance(entry, str) and entry not in ("_self_", *seen) and "/" not in entry:
            merged.update(_option_node(group, entry, (*seen, option)))
    return {**merged, **node}


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
