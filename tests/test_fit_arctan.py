"""scripts/fit_arctan.py: models.common's arctan polynomials are the script's fits, within the
errors the comments quote."""

import importlib.util
from pathlib import Path

import numpy as np

from models import common

REPO = Path(__file__).resolve().parent.parent


def test_arctan_coefficients_are_the_scripts_fit():
    spec = importlib.util.spec_from_file_location("fit_arctan", REPO / "scripts" / "fit_arctan.py")
    fit_arctan = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fit_arctan)
    for shipped, dtype, bound in ((common._ATAN_F32, "float32", 2.5e-9), (common._ATAN_F64, "float64", 6e-17)):
        coefficients, error = fit_arctan.fit(fit_arctan.DEGREES[dtype])
        np.testing.assert_allclose(shipped, coefficients, rtol=1e-12, atol=0)
        assert error < bound
