"""Compiled programs kept within a process: a program whose lowering (its StableHLO text) and devices are
those of a program compiled before in this process is not compiled again. Runs of one problem in one
process (a sweep's points that differ in the seed, a repeated or resumed run, `runner.run` in a notebook)
compile once; a program that differs in anything, a constant baked into it included, is a new one."""

import collections
import hashlib
import logging

from runner.parallel import mesh

log = logging.getLogger(__name__)

KEPT = 16  # executables kept, the least recently used dropped first
_kept: collections.OrderedDict = collections.OrderedDict()
counts = collections.Counter()  # "compiled", "reused": this process's compilations and reuses


def compiled(lowered, layout):
    """`lowered.compile()`, or the executable compiled before in this process from the same lowering
    for the same devices of `layout` (a `runner.parallel.mesh.Layout`)."""
    key = (hashlib.sha256(lowered.as_text().encode()).hexdigest(), mesh.device_ids(layout))
    if key in _kept:
        _kept.move_to_end(key)
        counts["reused"] += 1
        return _kept[key]
    executable = lowered.compile()
    counts["compiled"] += 1
    _kept[key] = executable
    while len(_kept) > KEPT:
        _kept.popitem(last=False)
    return executable


def clear():
    """Forgets every kept executable (the next program of each kind compiles again)."""
    _kept.clear()
