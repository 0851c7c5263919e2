"""How XLA:CPU compiles loops around a model: keeping convolutions out of single-kernel loops."""


import jax
import jax.numpy as jnp
import numpy as np


def outside_loop_kernels(value, anchor):
    """`value`, unchanged, tied to a LAPACK call that keeps XLA:CPU from compiling any loop
    around it into a single kernel (`SMALL_LOOP_BYTES`): such a loop stays operation by
    operation, its convolutions in XLA's convolution library. A no-op on other backends.

    Args:
        value: an array of batch shape B (e.g. log psi of configurations [*B, N]).
        anchor: an array of shape B that varies inside the loop (e.g. each configuration's
            first spin), so the call cannot be moved out of it; its values are only squared.

    Returns:
        `value`, bit for bit: the call is a Cholesky factor of 1 + a^2 >= 1 per element a of
        `anchor`, which is always positive, selecting `value` (NaN otherwise, never taken).
    """
    if jax.default_backend() != "cpu":
        return value
    a = jax.lax.stop_gradient(anchor).astype(np.float32)
    positive = jax.lax.linalg.cholesky((1 + a * a)[..., None, None])[..., 0, 0] > 0
    return jnp.where(positive, value, np.nan)
