"""A chunk size from a memory budget: a pure function of the problem's sizes, the same on every
process and layout (so chunking, which does not change the numbers' bits, is chosen identically)."""

DEFAULT_BUDGET_BYTES = 2 * 1024**3  # 2 GiB: the default budget (deterministic, not read from the machine)


def bytes_per_sample(n_params: int, n_sites: int, n_connected: int, itemsize: int) -> int:
    """A rough upper estimate of the memory one sample takes in a step: its row of log-derivatives
    (with a few copies for products and centring) and its connected configurations with their
    log psi and matrix elements."""
    return itemsize * (4 * n_params + n_connected * (n_sites + 2) + n_sites)


def auto_chunk(n_samples: int, n_chains: int, n_params: int, n_sites: int, n_connected: int,
               itemsize: int, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> int | None:
    """The largest chunk (a multiple of n_chains whose per-chain part divides the samples per chain,
    as `runner.config.build._check_chunk` requires) whose estimated memory fits in the budget;
    None when all samples fit at once. At least n_chains (one sample per chain) when nothing fits."""
    per_chain = n_samples // n_chains
    per = bytes_per_sample(n_params, n_sites, n_connected, itemsize)
    if per * n_samples <= budget_bytes:
        return None
    fitting = max(1, budget_bytes // (per * n_chains))
    t = max(d for d in range(1, per_chain + 1) if per_chain % d == 0 and d <= fitting)
    return t * n_chains
