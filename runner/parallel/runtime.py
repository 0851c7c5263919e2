"""Process settings the runner owns (threads, XLA:CPU loop kernels, malloc), set before JAX starts."""

import os

# XLA:CPU runs a while loop whose buffers stay under this many bytes as one compiled kernel
# instead of dispatching every operation of its body separately (default 1 kB): a Metropolis
# sweep is microseconds of arithmetic, which per-operation dispatch would dominate.
SMALL_LOOP_BYTES = 8_000_000

# glibc malloc returns freed blocks above its mmap threshold to the kernel, so every step's large
# buffers would be fresh pages that fault in again: allocate from the heap and keep up to 1 GiB
# of it (measurements: docs/notes/benchmarks.md, "Deep models").
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
