"""A recipe's `monte_carlo` set-up (conf/monte_carlo/): the keys that replace the recipe's own where its
Hilbert space is beyond the full sum's reach, so that one command runs a lattice at every size."""

import logging

from runner.core.sampler import FULL_SUM_MAX_STATES
from runner.errors import ConfigError, require_int

log = logging.getLogger(__name__)

KEY = "monte_carlo"
ABOVE = "above"  # the set-up's own key: the number of states beyond which it applies


def resolve(config: dict, instantiate, overrides=(), *, say: bool = False) -> dict:
    """`config` without its `monte_carlo` node, whose keys replace the config's where the Hilbert space has
    more than `monte_carlo.above` states (null: the full sum's reach, 2^16): a node naming another
    `_target_` replaces the config's whole, other nodes are merged key by key.

    Args:
        config: the resolved config.
        instantiate: `runner.config.build.instantiate` (passed in: build calls this module), which builds
            `config["hilbert"]` to count its states, only when there is a set-up.
        overrides: the command line's overrides (`key=value`, `group=option`); one whose value the set-up
            changes is refused rather than dropped.
        say: log one line naming what the set-up sets (the run's; other callers stay quiet).

    Raises:
        ConfigError: the set-up sets `hilbert` (the size decides), its `above` is not an integer, or it
            changes a key the command line set.
    """
    block = config.get(KEY)
    out = {k: v for k, v in config.items() if k != KEY}
    if block is None:
        return out
    if not isinstance(block, dict):
        raise ConfigError(KEY, f"must be null or a set-up (monte_carlo=OPTION), not {block!r}")
    block = dict(block)
    above = block.pop(ABOVE, None)
    above = FULL_SUM_MAX_STATES if above is None else require_int(f"{KEY}.{ABOVE}", above, minimum=0)
    fixed = next((k for k in ("hilbert", KEY) if k in block), None)
    if fixed is not None:
        raise ConfigError(f"{KEY}.{fixed}", "cannot be set by the set-up: the Hilbert space decides whether it applies")
    states = instantiate("hilbert", config.get("hilbert")).n_states
    if states <= above:
        return out
    paths = replaced(out, block)
    for line in overrides:
        key = str(line).partition("=")[0].lstrip("+~")
        hit = next((p for p in paths if key == p or key.startswith(p + ".")), None)
        if hit is not None:
            raise ConfigError(str(line), f"is replaced by the monte_carlo set-up, which sets {hit} for the {states} "
                                         f"states (beyond {above}); set monte_carlo.{key} instead, or ~monte_carlo "
                                         "for the recipe's own set-up")
    if paths and say:
        log.info("monte_carlo: %d states, beyond %d: the set-up sets %s", states, above, ", ".join(paths))
    return merge(out, block)


def merge(base, new):
    """`new` over `base`: a dict merged key by key unless `new` names a `_target_` other than `base`'s,
    anything else replaced."""
    if not (isinstance(base, dict) and isinstance(new, dict)) or _other_target(base, new):
        return new
    return {**base, **{k: merge(base.get(k), v) for k, v in new.items()}}


def replaced(base: dict, new: dict, prefix: str = "") -> list:
    """The dotted paths whose values `merge(base, new)` changes (a node replaced whole by its path)."""
    out = []
    for key, value in new.items():
        path, old = f"{prefix}{key}", base.get(key)
        if isinstance(old, dict) and isinstance(value, dict) and not _other_target(old, value):
            out += replaced(old, value, path + ".")
        elif old != value:
            out.append(path)
    return out


def _other_target(base: dict, new: dict) -> bool:
    return "_target_" in new and new["_target_"] != base.get("_target_")
