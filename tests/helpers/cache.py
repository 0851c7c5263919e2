"""Where the tests' persistent compilation cache lives: a directory per CPU and JAX version, so a clone
moved to another machine (or a CI cache restored on another CPU) never loads programs compiled for
instructions this CPU lacks."""

import hashlib
from importlib import metadata
from pathlib import Path


def cpu_key(cpuinfo: str, versions: dict) -> str:
    """12 hex digits of a hash of the CPU's model name and flags (the first processor of
    /proc/cpuinfo's text) and the given package versions."""
    fields = {}
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("model name", "flags", "Features", "CPU part") and name.strip() not in fields:
            fields[name.strip()] = " ".join(sorted(value.split()))
    text = "\n".join(f"{k}={v}" for k, v in sorted({**fields, **versions}.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def cache_dir(root: Path) -> Path:
    """root/jax-<cpu_key> for this machine's CPU and the installed jax and jaxlib."""
    versions = {name: metadata.version(name) for name in ("jax", "jaxlib")}
    return Path(root) / f"jax-{cpu_key(_read('/proc/cpuinfo'), versions)}"
