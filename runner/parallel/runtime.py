"""Process settings the runner owns (threads, XLA:CPU loop kernels, malloc), set before JAX starts."""

import os

# XLA:CPU runs a while loop whose buffers stay under this many bytes as one compiled kernel
# instead of dispatching every operation of its body separately (default 1 kB). A Metropolis
# step on 16 chains is a few microseconds of arithmetic, so per-operation dispatch dominated
# it: with the limit raised, a 6x6 RBM step takes 1.8 us instead of 2.8 us.
SMALL_LOOP_BYTES = 8_000_000

# A convolution inside such a kernel runs through XLA's own emitted loops instead of its
# convolution library: a 6x6 CNN's Metropolis draw on 16 chains took 206 ms instead of 152, on
# 64 complex64 chains 3,300 ms instead of 353 (docs/benchmarks.md, "Loops with convolutions").
# XLA leaves a loop that contains a custom call out of that compilation, so a model with
# convolutions ties each of its evaluations to one (`outside_loop_kernels`).
# glibc malloc hands a freed block above its mmap threshold (128 kB, rising to at most 32 MB)
# back to the kernel, so every step's large buffers (local energies of all connected
# configurations, activations of the per-sample derivatives) are fresh pages that fault in
# again. Allocating from the heap only, and keeping up to 1 GiB of freed heap, reuses them:
# a 6 x 6 ViT bench step 0.379 s instead of 0.460 s, its peak memory 1,041 MB instead of 968
# (docs/benchmarks.md, "Deep models").
MALLOC_SETTINGS = {"MALLOC_MMAP_MAX_": 0, "MALLOC_TRIM_THRESHOLD_": 1 << 30}

_MALLOPT_PARAMS = {"MALLOC_MMAP_MAX_": -4, "MALLOC_TRIM_THRESHOLD_": -1}  # M_MMAP_MAX, M_TRIM_THRESHOLD

def configure_runtime():
    """Process settings the runner owns; effective only before JAX starts its backend.

    Keeps OpenBLAS (used by JAX's CPU LAPACK calls) from fighting XLA for the cores, lets
    XLA:CPU compile small loops (the Metropolis sweep) into single kernels, and keeps glibc from
    returning large buffers to the kernel (`MALLOC_SETTINGS`: set in this process by `mallopt`,
    and in the environment for the processes it starts). A user's own OPENBLAS_NUM_THREADS,
    `--xla_backend_extra_options` or MALLOC_ variables win.
    """
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    _tune_malloc()
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_backend_extra_options" not in flags:
        option = f"--xla_backend_extra_options=xla_cpu_small_while_loop_byte_threshold={SMALL_LOOP_BYTES}"
        os.environ["XLA_FLAGS"] = f"{flags} {option}".strip()

def _tune_malloc():
    """Applies the unset `MALLOC_SETTINGS` to this process (glibc only) and its environment; a
    variable already set was read by glibc when the process started."""
    import ctypes
    import platform

    unset = {k: v for k, v in MALLOC_SETTINGS.items() if k not in os.environ}
    if not unset or platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    for key, value in unset.items():
        if mallopt(_MALLOPT_PARAMS[key], value) == 1:
            os.environ[key] = str(value)
