import pytest

from runner.core.memory import auto_chunk, bytes_per_sample


@pytest.mark.parametrize("n_samples,n_chains", [(4096, 16), (1024, 8), (600, 6), (128, 128)])
@pytest.mark.parametrize("budget", [10**4, 10**6, 10**8])
def test_auto_chunk_divides_and_respects_budget(n_samples, n_chains, budget):
    args = dict(n_params=300, n_sites=16, n_connected=17, itemsize=8)
    chunk = auto_chunk(n_samples, n_chains, **args, budget_bytes=budget)
    per = bytes_per_sample(**args)
    if chunk is None:
        assert per * n_samples <= budget
        return
    per_chain = n_samples // n_chains
    assert chunk % n_chains == 0 and per_chain % (chunk // n_chains) == 0
    assert chunk == n_chains or per * chunk <= budget
    # the largest such chunk
    bigger = [d * n_chains for d in range(chunk // n_chains + 1, per_chain + 1) if per_chain % d == 0]
    assert all(per * b > budget for b in bigger)


def test_auto_chunk_is_deterministic():
    a = auto_chunk(4096, 16, 300, 16, 17, 16, 10**6)
    assert a == auto_chunk(4096, 16, 300, 16, 17, 16, 10**6)
