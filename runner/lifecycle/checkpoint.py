"""Atomic checkpoints of the whole VMC state: the newest in state.npz, the one before it in
state.prev.npz; a reader falls back to the previous when the newest is unreadable or missing."""

import json
import logging
import os
import tempfile
from pathlib import Path

import zipfile

import jax
import numpy as np

from runner.errors import ConfigError

FILENAME = "state.npz"
PREVIOUS = "state.prev.npz"  # the checkpoint before the newest, kept for when the newest is unreadable
_NEXT = "state.next.npz"  # the new checkpoint, complete on disk before the rotation's two renames

log = logging.getLogger(__name__)


class CorruptCheckpoint(ConfigError):
    """A checkpoint file that cannot be read (truncated, corrupt, not a checkpoint); one sentence naming it."""

    def __init__(self, path: Path, err: BaseException):
        super().__init__("checkpoint", f"{path} is unreadable, truncated or corrupt (not a complete .npz of "
                         f"arrays: {type(err).__name__}); use resume=false to start over (the old records are "
                         "moved aside) or a new run directory")


def _open(path: Path):
    """np.load of a checkpoint without unpickling (allow_pickle=False); CorruptCheckpoint if it is not a readable .npz."""
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise CorruptCheckpoint(path, err) from None
    if not isinstance(data, np.lib.npyio.NpzFile) or "meta" not in data.files:
        raise CorruptCheckpoint(path, ValueError("no meta record"))
    return data


def _meta(data, path: Path) -> dict:
    try:
        return json.loads(bytes(data["meta"]).decode())
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise CorruptCheckpoint(path, err) from None


def write_atomic(target, write) -> Path:
    """Writes a file atomically: `write(f)` fills a temporary file (binary) in the same directory,
    which is flushed to disk and renamed over `target`, so a reader sees the old file or the
    whole new one, never a half-written one.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.stem}-", suffix=target.suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return target


def save(directory, state, meta: dict) -> Path:
    """Writes `state` (a pytree of arrays) and `meta` to directory/state.npz, the old one kept as
    state.prev.npz.

    The new file is written whole and flushed to disk first (state.next.npz), then the old one is
    renamed to state.prev.npz and the new one to state.npz: at every moment a complete newest
    checkpoint is state.npz, or state.prev.npz between the two renames.
    """
    leaves = [np.asarray(x) for x in jax.tree_util.tree_leaves(state)]
    arrays = {f"leaf_{i:04d}": x for i, x in enumerate(leaves)}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    directory = Path(directory)
    write_atomic(directory / _NEXT, lambda f: np.savez(f, **arrays))
    if (directory / FILENAME).is_file():  # rotation: each rename atomic; between them state.prev.npz is the newest
        os.replace(directory / FILENAME, directory / PREVIOUS)
    os.replace(directory / _NEXT, directory / FILENAME)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return directory / FILENAME


def exists(directory) -> bool:
    """Whether a checkpoint (the newest or the previous) is there."""
    return any((Path(directory) / name).is_file() for name in (FILENAME, PREVIOUS))


def _read(directory, read):
    """read(path) of the newest checkpoint, else of the previous with a warning naming the
    unreadable newest; CorruptCheckpoint (the newest's) when neither can be read."""
    newest, previous = Path(directory) / FILENAME, Path(directory) / PREVIOUS
    if not newest.is_file() and previous.is_file():
        log.warning("checkpoint %s is missing; using the previous checkpoint %s", newest, previous)
        return read(previous)
    try:
        return read(newest)
    except CorruptCheckpoint as err:
        if not previous.is_file():
            raise
        try:
            result = read(previous)
        except CorruptCheckpoint:
            raise err from None
        log.warning("checkpoint %s is unreadable (truncated or corrupt); using the previous checkpoint %s",
                    newest, previous)
        return result


def read_meta(directory) -> dict:
    """The meta dict of a checkpoint (the previous one when the newest is unreadable), without
    reading its arrays (CorruptCheckpoint: neither is readable)."""
    def read(path):
        with _open(path) as data:
            return _meta(data, path)
    return _read(directory, read)


def load(directory, like):
    """Reads a checkpoint into the structure of `like` (same treedef, shapes and dtypes): the
    newest, or the previous with a warning when the newest is unreadable (its meta step is the
    one to resume from, so metrics past it are dropped as on any resume).

    Returns:
        (state, meta) with NumPy leaves.

    Raises:
        CorruptCheckpoint: the file is unreadable (truncated, corrupt); never unpickles.
        ValueError: the checkpoint does not match `like` (a different config).
    """
    return _read(directory, lambda path: _load(path, like))


def _load(path: Path, like):
    """(state, meta) of the checkpoint file `path` into the structure of `like`."""
    with _open(path) as data:
        meta = _meta(data, path)
        leaves_like, treedef = jax.tree_util.tree_flatten(like)
        n = len([k for k in data.files if k.startswith("leaf_")])
        if n != len(leaves_like):
            raise ValueError(f"checkpoint has {n} arrays, the config needs {len(leaves_like)}")
        leaves = []
        for i, ref in enumerate(leaves_like):
            try:
                x = data[f"leaf_{i:04d}"]
            except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as err:
                raise CorruptCheckpoint(path, err) from None
            if x.shape != tuple(ref.shape) or x.dtype != np.dtype(ref.dtype):
                raise ValueError(
                    f"checkpoint array {i} is {x.dtype}{list(x.shape)}, the config needs "
                    f"{np.dtype(ref.dtype)}{list(ref.shape)}"
                )
            leaves.append(x)
    return jax.tree_util.tree_unflatten(treedef, leaves), meta
