"""The polynomials of `models.common.arctan2`: arctan r = r + r^3 P(r^2) on |r| <= tan(pi/8).

P is a Chebyshev least-squares fit of (arctan r - r) / r^3 in z = r^2 (2,000 Chebyshev nodes on
[0, tan(pi/8)^2]), the target summed from its Taylor series (convergent there: |z| <= 0.172, 60
terms) so no cancellation enters it. Degree 4 for float32, 10 for float64. Prints each fit's
coefficients, lowest order first, and its largest error in arctan r / r on a fine grid:

    python scripts/fit_arctan.py
"""

import math

import numpy as np
from numpy.polynomial import chebyshev, polynomial

Z_MAX = math.tan(math.pi / 8) ** 2
DEGREES = {"float32": 4, "float64": 10}


def target(z):
    """(arctan r - r) / r^3 at z = r^2, from the series sum_k (-1)^k z^(k-1) / (2k + 1)."""
    out, power = np.zeros_like(z), np.ones_like(z)
    for k in range(1, 60):
        out += (-1) ** k * power / (2 * k + 1)
        power = power * z
    return out


def fit(degree: int) -> tuple[np.ndarray, float]:
    """(P's coefficients in z, lowest first; max |r^2 (P - target)| on [0, Z_MAX])."""
    nodes = Z_MAX / 2 * (1 + np.cos(np.pi * (np.arange(2000) + 0.5) / 2000))
    in_u = chebyshev.cheb2poly(chebyshev.chebfit(2 * nodes / Z_MAX - 1, target(nodes), degree))
    in_z = polynomial.Polynomial(in_u)(polynomial.Polynomial([-1, 2 / Z_MAX]))
    grid = np.linspace(0, Z_MAX, 100_001)
    return in_z.coef, float(np.max(np.abs(in_z(grid) - target(grid)) * grid))


def main():
    for dtype, degree in DEGREES.items():
        coefficients, error = fit(degree)
        print(f"{dtype} (degree {degree}, max error {error:.1e}): {tuple(float(c) for c in coefficients)}")


if __name__ == "__main__":
    main()
