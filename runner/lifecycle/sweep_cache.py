"""Values shared by the points of a sweep (the exact ground energy), one JSON file per config key."""

import json
from pathlib import Path

from runner.config import fingerprint
from runner.lifecycle import checkpoint


def path(directory, key: dict) -> Path:
    """The file holding the value for `key` (a flattened config) under `directory`."""
    return Path(directory) / f"{fingerprint.digest(key)}.json"


def read(directory, key: dict):
    """The value stored for `key`, or None (no file, an unreadable one, or one for another config)."""
    try:
        stored = json.loads(path(directory, key).read_text())
    except (OSError, ValueError):
        return None
    # The hash names the file; the stored config proves it is this one.
    if not isinstance(stored, dict) or not isinstance(stored.get("config"), dict):
        return None
    if fingerprint.first_difference(stored["config"], key) is not None:
        return None
    return stored.get("value")


def write(directory, key: dict, value) -> Path:
    """Stores `value` for `key`, atomically: a concurrent reader sees the whole file or none."""
    text = json.dumps({"value": value, "config": key}, indent=2) + "\n"
    return checkpoint.write_atomic(path(directory, key), lambda f: f.write(text.encode()))
