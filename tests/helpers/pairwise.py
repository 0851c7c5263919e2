"""An all-pairs covering set for pytest parametrisation: every value of every factor meets every value
of every other factor in at least one case, in far fewer cases than the full product when the code
paths depend on two factors at most."""

import itertools


def _pairs(row):
    """The (factor, value) pairs of one case, as a set of frozen pairs of (index, value)."""
    return {((i, row[i]), (j, row[j])) for i, j in itertools.combinations(range(len(row)), 2)}


def pairwise(*factors, allowed=None):
    """Cases (tuples, one value per factor) covering every pair of values that some allowed case of
    the full product holds.

    Greedy and deterministic: from the allowed cases of the product, in product order, repeatedly
    takes the first one that covers the most pairs not yet covered. With one factor the result is
    that factor's values; with two, the full product.

    Args:
      *factors: lists of values (hashable), one list per factor.
      allowed: optional predicate on a case tuple; cases it rejects are never chosen, and pairs only
        rejected cases hold need no cover.

    Returns:
      The list of chosen case tuples.
    """
    candidates = [row for row in itertools.product(*factors) if allowed is None or allowed(row)]
    if len(factors) < 2:
        return candidates
    covers = [_pairs(row) for row in candidates]
    uncovered = set().union(*covers)
    chosen = []
    while uncovered:
        best = max(range(len(candidates)), key=lambda k: len(covers[k] & uncovered))
        chosen.append(candidates[best])
        uncovered -= covers[best]
    return chosen
