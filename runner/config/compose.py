"""The one composition of conf/ by the CLI, `runner.run` and `runner.evaluate`: Hydra composes, and each
`group.key=value` override is checked against the option Hydra composed for that group."""

import contextlib
import difflib
import itertools
from pathlib import Path
from typing import NamedTuple

from runner.config import fingerprint
from runner.errors import ConfigError

CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")
CONFIG_NAME = "config"


def compose(overrides=(), before=()):
    """The config Hydra composes from conf/ with `before`, then `overrides` (a single run: no
    sweeps), once `check_overrides` accepts `overrides`.

    Args:
        overrides: Hydra overrides (`group=option`, `group.key=value`, `+key=value`, `~key`).
        before: overrides applied first and not checked (e.g. those a run directory records).

    Returns:
        The composed DictConfig, unresolved, without the `hydra` node.

    Raises:
        ConfigError: a refused override (`check_overrides`), or overrides Hydra cannot compose.
    """
    from hydra import compose as hydra_compose

    overrides, before = [str(o) for o in overrides], [str(o) for o in before]
    with _hydra() as loader:
        _check(loader, overrides, before)
        return hydra_compose(CONFIG_NAME, overrides=[*before, *overrides])


def check_overrides(overrides, before=()):
    """Refuses an override that chooses a missing option (`group=option`, or any option of a sweep
    `group=a,b` or a list `group=[a,b]`), and a `key=value` whose first name is neither a config
    group nor a top-level key of the composed config, or whose `group.key` is not a key of the
    option Hydra composed for that group (after every experiment's defaults, an experiment that
    includes another included, and the command line's choices). `+key=` additions and `~key`
    deletions are Hydra's: composed as Hydra defines them, not checked; `hydra` overrides are Hydra's.

    Args:
        overrides: Hydra overrides as on the command line (sweeps allowed).
        before: overrides composed first and not checked.

    Raises:
        ConfigError: its str() is the one sentence, e.g. "model.groop is not a key of
            model=rbm_symm; did you mean group?".
    """
    with _hydra() as loader:
        _check(loader, [str(o) for o in overrides], [str(o) for o in before])


def composed(overrides=(), before=()):
    """(config, choices): the config `check_overrides` checks keys against, which Hydra composes
    from the overrides that choose options, add or delete keys (not those that set a key's value;
    of a sweep `group=a,b`, its first option), without its `hydra` node; and {group: chosen option}
    (None: no option; a list group such as logger: the list).

    Raises:
        ConfigError: Hydra cannot compose them.
    """
    with _hydra() as loader:
        split = _split(loader, [*map(str, before), *map(str, overrides)])
        return _base(loader, [*split.base, *(sweep[0] for sweep in split.sweeps)])


class _Split(NamedTuple):
    base: list  # override lines composed before keys are checked: choices, additions, deletions
    sweeps: list  # for each swept group, its choices as override lines
    keys: list  # the keys whose values the overrides change (checked)
    groups: list  # the parsed overrides that choose options (checked)


@contextlib.contextmanager
def _hydra():
    """Hydra's config loader for conf/ (the compose API's global state, cleared on leaving); a Hydra
    error as one sentence."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            yield GlobalHydra.instance().config_loader()
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError("overrides", f"cannot be composed ({' '.join(str(err).split())})") from None


def _groups(loader, parent: str = "") -> set:
    """The config groups of conf/, nested ones by their path (`task/integrator`), without Hydra's."""
    out = set()
    for name in loader.list_groups(parent):
        path = f"{parent}/{name}" if parent else name
        if path != "hydra":
            out |= {path, *_groups(loader, path)}
    return out


def _split(loader, overrides) -> _Split:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    groups = _groups(loader)
    split = _Split([], [], [], [])
    for override in OverridesParser.create(config_loader=loader).parse_overrides(overrides):
        name, sweep = override.key_or_group, override.is_sweep_override()
        if name == "hydra" or override.is_hydra_override():
            continue
        if "." in name and name.replace(".", "/") in groups and override.type.name == "CHANGE":
            raise ConfigError(name, f"is a config group nested in {name.partition('.')[0]}: choose its option "
                                    f"with {name.replace('.', '/')}=OPTION, one of: "
                                    f"{', '.join(loader.get_group_options(name.replace('.', '/')))}")
        if name in groups:
            split.groups.append(override)
            if not sweep:
                split.base.append(override.input_line)
            elif override.is_discrete_sweep():
                split.sweeps.append([f"{override.get_key_element()}={c}" for c in override.sweep_string_iterator()])
        elif override.type.name == "CHANGE":
            split.keys.append(name)
        elif not sweep:
            split.base.append(override.input_line)
        elif override.is_discrete_sweep():  # a sweep of additions: its first is added
            split.base.append(f"{override.get_key_element()}={next(override.sweep_string_iterator())}")
    return split


def _check(loader, overrides, before):
    split = _split(loader, overrides)
    for override in split.groups:
        if not override.is_delete():
            _check_options(loader, override)
    if not split.keys:
        return
    everything = _split(loader, [*before, *overrides])
    for shape in itertools.product(*everything.sweeps):
        cfg, choices = _base(loader, [*everything.base, *shape], [key.partition(".")[0] for key in split.keys])
        for key in split.keys:
            check_key(key, cfg, choices)


def _check_options(loader, override):
    group = override.key_or_group
    options = loader.get_group_options(group)
    if not override.is_sweep_override():
        value = override.value()
        chosen = value if isinstance(value, list) else [value]
    else:
        chosen = list(override.sweep_string_iterator()) if override.is_discrete_sweep() else []
    for choice in chosen:
        choice = "null" if choice is None else str(choice)  # Hydra deselects with ~group, not group=null
        if choice not in options:
            raise ConfigError(f"{group}={choice}", f"is not an option; choose one of: {', '.join(options)}.")


def _base(loader, lines, heads=None):
    """(config without its hydra node, {group: option}) that Hydra composes from `lines`
    (hydra.runtime.choices); a group of several options (logger=[jsonl,mlflow]), which those leave
    out, as their list when `heads` (default: all) names it."""
    from hydra import compose as hydra_compose
    from hydra.types import RunMode
    from omegaconf import OmegaConf, open_dict

    cfg = hydra_compose(CONFIG_NAME, overrides=lines, return_hydra_config=True)
    choices = {k: v for k, v in OmegaConf.to_container(cfg.hydra.runtime.choices).items()  # a nested group's
               if ("/" not in k or k.partition("/")[0] not in ("hydra", "")) and "@" not in k}  # (task/integrator);
    # not an option placed in another group's package (model@monte_carlo.model): its keys are that group's
    with open_dict(cfg):
        del cfg["hydra"]
    listed = set(loader.list_groups("")) - {"hydra"} - set(choices)
    if heads is not None:
        listed &= set(heads)
    if listed:
        for default in loader.compute_defaults_list(CONFIG_NAME, lines, RunMode.RUN).defaults:
            group, _, option = default.config_path.rpartition("/")
            if group in listed:
                choices.setdefault(group, []).append(option)
    for group in listed:  # a group the defaults list does not name
        choices.setdefault(group, None)
    return cfg, choices


def check_key(key: str, cfg, choices: dict):
    """Refuses the key of an override `key=value` (`check_overrides`) that `cfg` and `choices`, as
    `composed` gives them, do not have.

    Raises:
        ConfigError: the one sentence, naming the nearest valid names.
    """
    from omegaconf import DictConfig

    head, _, rest = key.partition(".")
    top = set(cfg.keys())
    if head not in choices and head not in top:
        raise ConfigError(head, f"is not a config group or top-level key; {_nearest(head, set(choices) | top)}")
    if not rest or head not in choices:
        return
    sub, chosen = rest.partition(".")[0], choices[head]
    option = f"{head}=" + (f"[{','.join(chosen)}]" if isinstance(chosen, list) else str(chosen))
    node = cfg[head] if head in top else None
    if not isinstance(node, DictConfig):
        raise ConfigError(f"{head}.{sub}", f"is not a key; no {head} option is chosen." if chosen is None else
                          f"is not a key of {option}, which sets other groups' and top-level keys.")
    path = head
    for sub in rest.split("."):  # down a nested node (task.integrator.dt), named by its own option
        names = set(node.keys())
        if sub not in names:
            names -= {"_target_"}
            instead = fingerprint.RETIRED_BY.get(f"{path}.{sub}")  # an old key: what replaced it
            renamed = fingerprint.RENAMED.get(f"{path}.{sub}")
            hint = instead or (f"it is {renamed} now." if renamed else "") or (
                _nearest(sub, names) if names else "it has no keys.")
            raise ConfigError(f"{path}.{sub}", f"is not a key of {option}; {hint}")
        node, path = node[sub], f"{path}.{sub}"
        if not isinstance(node, DictConfig):
            return
        nested = choices.get(path.replace(".", "/"))
        option = f"{path.replace('.', '/')}={nested}" if nested else path


def _nearest(name: str, names) -> str:
    close = difflib.get_close_matches(name, sorted(names), n=3, cutoff=0.6)
    return f"did you mean {' or '.join(close)}?" if close else f"valid names: {', '.join(sorted(names))}."
