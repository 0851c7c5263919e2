"""Collapse: what stops a training run early (`check_collapse`, after COLLAPSE_STEPS steps of it)
and what holds its checkpoints back meanwhile (`collapsing`, from the first such step)."""

from runner.diagnostics.health import ACCEPTANCE_LOW, R_HAT_MAX, VARIANCE_RISE, variance_floor

COLLAPSE_STEPS = 20  # training stops when each of this many consecutive steps shows the same collapse


def fell(first: dict, last: dict) -> bool:
    """Whether the energy went down from `first` to `last` by more than two combined error bars
    (a run leaving the near-eigenstate it started in has a rising variance and a falling energy)."""
    e0, e1 = first.get("energy"), last.get("energy")
    if e0 is None or e1 is None:
        return False
    bar = ((first.get("energy_error") or 0.0) ** 2 + (last.get("energy_error") or 0.0) ** 2) ** 0.5
    return e1 < e0 - 2 * bar


def check_collapse(records: list[dict], n_sites: int, metropolis: bool) -> str | None:
    """Why training should stop now, or None: over the last COLLAPSE_STEPS steps the chains were
    frozen apart (the Metropolis acceptance below ACCEPTANCE_LOW on every step, and the split
    R-hat above R_HAT_MAX or not finite on at least half of them: a sharply peaked state whose
    chains agree, e.g. an ordered phase, is not stopped), or the variance stayed above
    VARIANCE_RISE x its minimum over the steps before them (floored as in `check_variance`) while
    the energy did not go down (`fell`).

    Args:
        records: metrics.jsonl's records so far, the newest last.
        n_sites: the lattice's sites (for the variance floor).
        metropolis: the sampler is a Metropolis sampler (the acceptance criterion applies).
    """
    window, before = records[-COLLAPSE_STEPS:], records[:-COLLAPSE_STEPS]
    if len(window) < COLLAPSE_STEPS:
        return None
    acceptance = [r.get("acceptance") for r in window]
    apart = sum(r.get("r_hat") is None or r["r_hat"] > R_HAT_MAX for r in window)
    if metropolis and all(a is not None and a < ACCEPTANCE_LOW for a in acceptance) and 2 * apart >= len(window):
        return (f"collapsed: the Metropolis acceptance stayed below {ACCEPTANCE_LOW} for {COLLAPSE_STEPS} steps "
                f"(steps {window[0]['step']} to {window[-1]['step']}, last {acceptance[-1]:.3g}) and the split R-hat "
                f"was above {R_HAT_MAX} on {apart} of them: the chains are frozen apart")
    variances = [r.get("variance") for r in window]
    lowest = min((r["variance"] for r in before if r.get("variance") is not None), default=None)
    if lowest is None or any(v is None for v in variances):
        return None
    bound = VARIANCE_RISE * max(lowest, variance_floor(window[-1].get("energy"), n_sites))
    if all(v > bound for v in variances) and not fell(window[0], window[-1]):
        return (f"collapsed: the variance stayed above {VARIANCE_RISE:g}x its earlier minimum ({lowest:.3e}) for "
                f"{COLLAPSE_STEPS} steps (steps {window[0]['step']} to {window[-1]['step']}, last {variances[-1]:.3e})")
    return None


def collapsing(records: list[dict], n_sites: int, metropolis: bool) -> bool:
    """Whether the newest step already shows what `check_collapse` stops a run on after
    COLLAPSE_STEPS steps: a Metropolis acceptance below ACCEPTANCE_LOW, or a variance above
    VARIANCE_RISE x its minimum over the earlier steps (floored as there) with an energy that did not
    go down since the step before the rise. A checkpoint due at such a step waits (`loop`): a run
    that then fails as collapsed keeps the checkpoint from before its collapse began."""
    if not records:
        return False
    last = records[-1]
    if metropolis and last.get("acceptance") is not None and last["acceptance"] < ACCEPTANCE_LOW:
        return True
    lowest = min((r["variance"] for r in records[:-1] if r.get("variance") is not None), default=None)
    if lowest is None or last.get("variance") is None:
        return False
    bound = VARIANCE_RISE * max(lowest, variance_floor(last.get("energy"), n_sites))
    risen = [i for i, r in enumerate(records) if r.get("variance") is None or r["variance"] <= bound]
    before = records[risen[-1]] if risen else records[0]
    return last["variance"] > bound and not fell(before, last)
