"""scripts/fit_arctan.py and models.common's arctan polynomials: arctan r = r + r^3 P(r^2) on
|r| <= tan(pi/8), within the errors the comments beside the coefficients quote ("at most 2.4e-9
(float32, degree 4) and 5.2e-17 (float64, degree 10) from arctan r / r"), and the script's fit as
accurate.

Not the fit's digits: the script's least squares runs through LAPACK, whose rounding depends on
the BLAS kernels and threads, and the conversion from Chebyshev to monomial coefficients is
ill-conditioned, so the degree-10 coefficients differ by 1e-3 relative and more between machines
(on one CPU, OpenBLAS's Haswell kernels give the shipped digits, its SandyBridge and Nehalem ones
miss them by 3e-4 and 7e-3) while the polynomials they make agree to about 1e-17.

Everything below but the script's fit is elementwise NumPy arithmetic (correctly rounded products,
sums and quotients, no BLAS), so it gives the same numbers on every IEEE machine; only np.arctan
(libm's or NumPy's SIMD one) may differ by an ulp or so, and is used only where that is negligible
or allowed for."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from models import common

REPO = Path(__file__).resolve().parents[2]

# The quoted bounds are printed to two digits (the shipped fits' errors are 2.43e-9 and 5.21e-17):
# anything that rounds to them.
QUOTED = {"float32": 2.45e-9, "float64": 5.25e-17}
SHIPPED = {"float32": common._ATAN_F32, "float64": common._ATAN_F64}


@pytest.fixture(scope="module")
def fit_arctan():
    spec = importlib.util.spec_from_file_location("fit_arctan", REPO / "scripts" / "fit_arctan.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _p(z, coefficients):
    """P(z) by Horner's rule, highest order first, as models.common._horner does."""
    out = np.full_like(z, coefficients[-1])
    for c in coefficients[-2::-1]:
        out = out * z + c
    return out


def _error_from_arctan_over_r(coefficients, fit_arctan):
    """max |(r + r^3 P(r^2)) / r - arctan r / r| = max |z (P(z) - (arctan r - r) / r^3)| over 100,001
    points of z = r^2 in [0, tan(pi/8)^2], the target summed from its Taylor series (60 terms; the
    rest < 1e-47) so no cancellation enters it: np.arctan's own rounding (1e-16 of arctan r) would
    hide a 5e-17 error."""
    z = np.linspace(0, fit_arctan.Z_MAX, 100_001)
    return float(np.max(np.abs(_p(z, coefficients) - fit_arctan.target(z)) * z))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_shipped_polynomials_within_the_quoted_errors(dtype, fit_arctan):
    coefficients = SHIPPED[dtype]
    assert len(coefficients) - 1 == fit_arctan.DEGREES[dtype]
    assert _error_from_arctan_over_r(coefficients, fit_arctan) <= QUOTED[dtype]
    # Against np.arctan on a dense grid of r in (0, tan(pi/8)] (r + r^3 P(r^2) is odd, like arctan).
    r = np.linspace(0, common._TAN_PI_8, 200_001)[1:]
    approx = r + r * (r * r) * _p(r * r, coefficients)
    exact = np.arctan(r)
    if dtype == "float32":
        # The float64 evaluation and np.arctan are within a few 1e-16 of arctan r: nothing next
        # to the 2.4e-9 the comment quotes, so it is checked here too.
        assert np.max(np.abs(approx - exact) / r) <= QUOTED[dtype] + 1e-14
    else:
        # 5.2e-17 of r is under half an ulp of arctan r (>= 1e-16 r on this range), the float64
        # evaluation adds about half an ulp more (the r^3 P term is < 6% of r), and np.arctan is
        # within 1 ulp (glibc) to 4 ulp (NumPy's AVX-512 SVML loops) of arctan r.
        assert np.max(np.abs(approx - exact) / np.spacing(exact)) <= 6


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_scripts_fit_reaches_the_quoted_errors(dtype, fit_arctan):
    """The script's own fit is as good as the shipped one, by its own measure and by ours.

    float32: its error (2.43e-9) moves by 1e-16 between BLAS builds, far inside the quoted bound.
    float64: it moves by about 1e-17 (5.21e-17 with OpenBLAS's Haswell kernels, 5.94e-17 with its
    Nehalem ones; perturbing the Chebyshev coefficients by half an epsilon of the largest, about
    what the least squares' rounding can do, gave up to 9.6e-17), so the bound is the unit
    roundoff 2^-53: the polynomial's error stays below half an ulp of arctan r, which is what
    the float64 fit is for."""
    coefficients, error = fit_arctan.fit(fit_arctan.DEGREES[dtype])
    assert len(coefficients) == len(SHIPPED[dtype])
    bound = QUOTED[dtype] if dtype == "float32" else 2.0 ** -53
    assert error < bound
    assert _error_from_arctan_over_r(coefficients, fit_arctan) < bound
