"""The test helpers that choose cases and places: the all-pairs covering set (tests/helpers/pairwise.py)
and the compilation cache's directory keyed on the CPU (tests/helpers/cache.py)."""

import itertools

import pytest

from tests.helpers.cache import cache_dir, cpu_key
from tests.helpers.pairwise import pairwise


def _all_pairs(rows, n):
    return {((i, r[i]), (j, r[j])) for r in rows for i, j in itertools.combinations(range(n), 2)}


@pytest.mark.parametrize("sizes", [(2, 2, 2), (5, 3, 3), (4, 4, 2, 3), (3, 2, 2, 2, 2), (6, 2, 3)])
def test_pairwise_covers_every_pair_of_the_product_in_fewer_cases(sizes):
    factors = [[f"{k}{v}" for v in range(s)] for k, s in enumerate(sizes)]
    rows = pairwise(*factors)
    product = list(itertools.product(*factors))
    assert set(rows) <= set(product) and len(set(rows)) == len(rows)
    assert _all_pairs(rows, len(sizes)) == _all_pairs(product, len(sizes))
    a, b = sorted(sizes)[-2:]
    assert a * b <= len(rows) < len(product)  # the two largest factors' pairs bound it from below
    assert rows == pairwise(*factors)  # deterministic


def test_pairwise_of_two_factors_is_their_product_and_of_one_its_values():
    assert sorted(pairwise([1, 2, 3], "ab")) == sorted(itertools.product([1, 2, 3], "ab"))
    assert pairwise([1, 2, 3]) == [(1,), (2,), (3,)]


def test_pairwise_never_takes_a_rejected_case_and_covers_every_pair_an_allowed_one_holds():
    allowed = lambda row: not (row[0] == "x" and row[1] == 1)  # noqa: E731
    factors = (["x", "y", "z"], [0, 1], ["p", "q"])
    rows = pairwise(*factors, allowed=allowed)
    assert all(allowed(r) for r in rows)
    valid = [r for r in itertools.product(*factors) if allowed(r)]
    assert _all_pairs(rows, 3) == _all_pairs(valid, 3)


CPUINFO = ("processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse avx2\n\n"
           "processor\t: 1\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse avx2\n")


def test_the_cache_key_changes_with_the_cpu_flags_and_the_jax_version_only():
    versions = {"jax": "0.10.2", "jaxlib": "0.10.2"}
    key = cpu_key(CPUINFO, versions)
    assert len(key) == 12 and key == cpu_key(CPUINFO.replace("processor\t: 1", "processor\t: 7"), versions)
    assert key == cpu_key(CPUINFO.replace("fpu sse avx2", "avx2 fpu sse"), versions)  # flags in any order
    assert key != cpu_key(CPUINFO.replace("avx2", "avx512f"), versions)
    assert key != cpu_key(CPUINFO.replace("7B13", "9654"), versions)
    assert key != cpu_key(CPUINFO, {**versions, "jaxlib": "0.10.3"})


def test_the_cache_dir_is_under_its_root_and_names_this_machine(tmp_path):
    assert cache_dir(tmp_path).parent == tmp_path and cache_dir(tmp_path).name.startswith("jax-")
    assert cache_dir(tmp_path) == cache_dir(tmp_path)
