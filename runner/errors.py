"""The one exception type for bad configuration values, and small checks that raise it."""

import math


class ConfigError(ValueError):
    """A configuration value is not allowed.

    `key` names the offending key relative to its config group (e.g. `alpha`); the
    application prefixes the group (`model.alpha`) and prints one sentence.
    """

    def __init__(self, key: str, message: str):
        super().__init__(f"{key} {message}")
        self.key = key
        self.message = message

    def sentence(self, group: str | None = None) -> str:
        key = f"{group}.{self.key}" if group and self.key else (group or self.key)
        return f"{key} {self.message}".rstrip(".") + "."


def require_int(key, value, minimum=None):
    """Returns `value` as an int or raises ConfigError (bools and floats are refused)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(key, f"must be an integer (got {value!r})")
    if minimum is not None and value < minimum:
        raise ConfigError(key, f"must be at least {minimum} (got {value})")
    return value


def require_number(key, value, positive=False, nonnegative=False):
    """Returns `value` as a float or raises ConfigError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(key, f"must be a finite number (got {value!r})")
    if positive and not value > 0:
        raise ConfigError(key, f"must be a positive number (got {value})")
    if nonnegative and not value >= 0:
        raise ConfigError(key, f"must be zero or positive (got {value})")
    return float(value)


def require_bool(key, value):
    if not isinstance(value, bool):
        raise ConfigError(key, f"must be true or false (got {value!r})")
    return value


def require_choice(key, value, choices):
    if value not in choices:
        allowed = ", ".join(repr(c) if c is None else str(c) for c in choices)
        raise ConfigError(key, f"must be one of {allowed} (got {value!r})")
    return value


class RunEnded(Exception):
    """A run that ended without completing (`RunFailed`, `RunStopped`); `summary` is what it wrote
    to summary.json. Raised by the run; only entry points turn it into a process exit status."""

    def __init__(self, summary: dict):
        super().__init__(f"the run ended {summary.get('status')}: {summary.get('reason')}")
        self.summary = summary

    @property
    def status(self) -> str:
        return self.summary.get("status")


class RunFailed(RunEnded):
    """The run failed (status `failed`: a NaN, a diverged solver, an exception); exit status 1."""


class RunStopped(RunEnded):
    """The run was stopped by a signal after saving its checkpoint (status `preempted` or
    `interrupted`); it resumes from there. Exit status 3, or 130 for Ctrl-C."""
