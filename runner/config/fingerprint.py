"""The config fingerprint: every resolved key that changes a run's numbers, flattened, and its hash."""

import hashlib
import json

from runner.config import task
from runner.errors import ConfigError
from runner.physics import hamiltonians

# Top-level keys and groups that never change the numbers of a run: its length, when it
# checkpoints, whether it resumes, whether the exact energy is computed, and how the chains
# are laid out over devices and processes (a checkpoint resumes on any layout with the same
# number of chains). The memory budget counts through the chunk it picks, which the build writes
# into chunk_size. Everything else, keys added later included, is fingerprinted.
EXCLUDED = ("n_iter", "resume", "checkpoint_every", "exact", "parallel", "logger", "optimized_metric", "hydra",
            "memory_budget")
# Keys (or whole groups) that change a finished run's summary but not its trajectory or
# checkpoints: resuming ignores them, returning a completed run's summary does not. Observables
# are measured on the samples a step draws anyway and never feed back into the parameters; the
# peak search looks at the final parameters only. A time evolution continues to a later t_end
# through the same saved times.
RESUME_IGNORES = ("final_rounds", "observables", "peak_search", "task.t_end")
# Keys the runner no longer has (top-level, or `group.key`), with the value under which a stored run
# did what today's code does.
RETIRED = {"peak_restart_every": 0, "model.symmetries": "none", "model.parity": None, "model.momentum": None,
           "model.activation": "log_cosh"}
_PROJECTION = ("model.symmetries", "model.parity", "model.momentum")
# Retired group keys of some constructors only (`_target_` by its last name): another may have a key of that name.
RETIRED_OWNERS = {**{key: ("RBMSymm", "CNN", "ViT") for key in _PROJECTION}, "model.activation": ("CNN",)}
# What replaced a retired key, said when a stored run holds it at another value.
RETIRED_BY = {**{key: "model.sector replaces model.symmetries, parity and momentum" for key in _PROJECTION},
              "model.activation": "the CNN's nonlinearity is log_cosh"}
# Groups whose node an older version spelled otherwise, with the function that writes a stored node the
# way today's config does (and leaves today's as it is): a stored run resumes, loads and compares as if
# written today.
UPGRADES = {"task": task.upgraded, "hamiltonian": hamiltonians.upgraded}
# Keys that have another name now (`group.key` -> today's `group.key`, or `group/sub` for a nested
# group's choice), said when a command line uses the old one.
RENAMED = {**{f"task.{old}": new if new.startswith("task/") else f"task.{new}" for old, new in task.FLAT_KEYS.items()},
           "hamiltonian.sign_rule": "hamiltonian.phase_prior (true: marshall, false: none)"}


def upgraded(config: dict) -> dict:
    """A stored run's config in today's spelling (`UPGRADES`)."""
    return {k: UPGRADES[k](v) if k in UPGRADES else v for k, v in config.items()}


def _upgraded_flat(flat: dict) -> dict:
    """A flattened fingerprint in today's spelling: each `UPGRADES` group's keys nested again,
    upgraded and flattened (in place of the group's first key)."""
    out = {}
    for group, upgrade in UPGRADES.items():
        keys = [k for k in flat if k.startswith(group + ".")]
        if not keys:
            continue
        node = {}
        for key in keys:
            *path, leaf = key.split(".")[1:]
            parent = node
            for name in path:
                parent = parent.setdefault(name, {})
            parent[leaf] = flat[key]
        new = of({group: upgrade(node)}, exclude=())
        out = {}
        for key, value in flat.items():
            if key == keys[0]:
                out.update(new)
            elif key not in keys:
                out[key] = value
        flat = out
    return flat


def without_retired_overrides(overrides, config: dict) -> list[str]:
    """A stored run's command-line overrides as today's code reads them: `group.key=value` lines
    of a key retired for that run's config (`RETIRED`, `RETIRED_OWNERS`; `config` as stored, before
    `without_retired`) left out, the old spellings of `UPGRADES` groups in today's."""
    flat = of(config, exclude=())
    lines = [str(line) for line in overrides]
    kept = [line for line in lines if not _retired(line.partition("=")[0].lstrip("+"), flat)]
    return hamiltonians.upgraded_overrides(task.upgraded_overrides(kept))


def _retired(key: str, flat: dict) -> bool:
    """Whether `key` of the flattened config `flat` is a retired key (`RETIRED`, `RETIRED_OWNERS`)."""
    if key not in RETIRED:
        return False
    owners = RETIRED_OWNERS.get(key)
    target = flat.get(key.rpartition(".")[0] + "._target_")
    return owners is None or (isinstance(target, str) and target.rsplit(".", 1)[-1] in owners)


def without_retired(config: dict) -> dict:
    """A stored run's config without the retired keys (`RETIRED`), which it holds at the value
    that behaved as today's code does.

    Raises:
        ConfigError: a retired key at another value (today's code cannot redo that run).
    """
    flat = of(config, exclude=())
    out = dict(config)
    for key in RETIRED:
        if key not in flat or not _retired(key, flat):
            continue
        if _canonical(flat[key]) != RETIRED[key]:
            instead = f" ({RETIRED_BY[key]})" if key in RETIRED_BY else ""
            raise ConfigError(key, f"is {show(flat[key])} in that run, an option this version no longer has{instead}")
        group, _, name = key.rpartition(".")
        if group:
            out[group] = {k: v for k, v in out[group].items() if k != name}
        else:
            out.pop(key)
    return out


def _ignored(key: str, ignore) -> bool:
    """Whether `key` is one of `ignore` or lies in one of those groups."""
    return any(key == name or key.startswith(name + ".") for name in ignore)


def of(config: dict, exclude=EXCLUDED) -> dict:
    """The flattened fingerprint of a resolved config.

    Args:
        config: the plain (resolved) experiment config.
        exclude: top-level keys left out (the trackers' params keep all but `hydra`).

    Returns:
        {"group.key": value} for every key that changes the numbers, nested dicts flattened
        with dots, lists kept as values, in the config's order. The default task (ground_state)
        is left out: a ground-state run keeps the fingerprint it had before tasks existed.
    """
    flat = {}

    def walk(prefix, node):
        for key, value in node.items():
            name = f"{prefix}{key}"
            if isinstance(value, dict) and value:
                walk(name + ".", value)
            else:
                flat[name] = value

    walk("", {k: v for k, v in config.items() if k not in exclude and not (k == "task" and task.is_default(v))})
    return _without_module_paths(flat)


def _without_module_paths(flat: dict) -> dict:
    """`_target_` values by their last name (`runner.physics.hamiltonians.ising` -> `ising`): where
    the code lives never changes the numbers, so a run directory survives a move of its modules."""
    return {k: v.rsplit(".", 1)[-1] if k.rsplit(".", 1)[-1] == "_target_" and isinstance(v, str) else v
            for k, v in flat.items()}


def _comparable(flat: dict) -> dict:
    """A flattened fingerprint as compared: today's spelling (`UPGRADES`), no module paths, no
    retired key at its neutral value."""
    flat = _without_module_paths(_upgraded_flat(flat))
    return {k: v for k, v in flat.items() if not (_retired(k, flat) and _canonical(v) == RETIRED[k])}


def _canonical(value):
    """Numbers compared by value: `h: 1` and `h: 1.0` give the same numbers."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return value


def digest(flat: dict) -> str:
    """A short hash of a flattened fingerprint (equal for configs that give the same numbers)."""
    text = json.dumps(_canonical(_comparable(flat)), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def same(stored_record, flat: dict) -> bool:
    """Whether a stored fingerprint record holds this config: no key differs (`first_difference`:
    a key added later and null here, or a retired one at its neutral value, is no difference)."""
    return isinstance(stored_record, dict) and isinstance(stored_record.get("config"), dict) and (
        first_difference(stored_record["config"], flat) is None)


def record(flat: dict) -> dict:
    """What is stored in a checkpoint's meta and in summary.json under "config_fingerprint"."""
    return {"hash": digest(flat), "config": flat}


def stamp(summary: dict, flat: dict) -> dict:
    """Adds the fingerprint record to a summary dict (in place) and returns it."""
    summary["config_fingerprint"] = record(flat)
    return summary


WARM_START_KEYS = ("init_from", "init_chains")


def fingerprinted(config: dict, source) -> dict:
    """The config whose fingerprint a run carries: the warm-start keys replaced by the source's
    identity (its fingerprint and step) when there is one, and left out when there is none
    (a cold start has the fingerprint it had before warm starts existed)."""
    out = {k: v for k, v in config.items() if k not in WARM_START_KEYS}
    if source is not None:
        out["init_from"] = source.identity()
    return out


MISSING = object()


def first_difference(stored: dict, current: dict, ignore=()):
    """The first key whose value differs, in the current config's order, then the stored one's.

    A key the stored run lacks and this config sets to null is no difference: keys added to the
    config later are null where they keep the behaviour of the code before them. Nor is a retired
    key (`RETIRED`) stored at the value that behaved as today's code does.

    Returns:
        (key, stored value, current value), a missing value being `MISSING`; or None.
    """
    stored, current = _comparable(stored), _comparable(current)
    for key in [*current, *(k for k in stored if k not in current)]:
        if _ignored(key, ignore):
            continue
        old, new = stored.get(key, MISSING), current.get(key, MISSING)
        if old is MISSING and new is None:
            continue
        if old is MISSING or new is MISSING or _canonical(old) != _canonical(new):
            return key, old, new
    return None


def show(value) -> str:
    """A value as it is written on the command line."""
    if value is MISSING:
        return "unset"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, separators=(",", ":"))
    return repr(value)


def check(stored_record, current: dict, run_dir, ignore=()) -> None:
    """Refuses to continue a stored run whose config differs from `current` in a number-changing key.

    Args:
        stored_record: the "config_fingerprint" record found in the run directory (None: written
            before fingerprints existed).
        current: this config's flattened fingerprint.
        run_dir: the run directory, named in the sentence.
        ignore: keys that may differ.

    Raises:
        ConfigError: one sentence naming the first differing key and both values.
    """
    restart = "use a new run directory or resume=false to start over"
    if not isinstance(stored_record, dict) or not isinstance(stored_record.get("config"), dict):
        raise ConfigError(
            "resume",
            f"found a run in {run_dir} written before config fingerprints were recorded, so it cannot be "
            f"checked against this config; {restart}",
        )
    diff = first_difference(stored_record["config"], current, ignore)
    if diff is not None:
        key, old, new = diff
        raise ConfigError(key, f"is {show(new)} in this config but {show(old)} in the run stored in {run_dir}; {restart}")
