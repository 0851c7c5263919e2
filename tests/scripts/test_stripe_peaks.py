"""scripts/stripe_peaks.py: the stripe-domain configurations and its report on a saved run."""

import importlib.util

import numpy as np
import pytest

from tests.helpers.cli import REPO, run_cli


def _script():
    spec = importlib.util.spec_from_file_location("stripe_peaks", REPO / "scripts" / "stripe_peaks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_stripe_domains_are_the_whole_row_and_column_configurations_of_zero_sz():
    configs = _script().stripe_domains(4).reshape(-1, 4, 4)
    assert len(configs) == 12 and len({c.tobytes() for c in configs}) == 12
    assert np.all(configs.sum(axis=(1, 2)) == 0)
    for c in configs:
        assert np.all(c == c[:1]) or np.all(c == c[:, :1])  # whole columns or whole rows


@pytest.mark.slow
def test_it_reports_a_saved_run(tmp_path, capsys):
    run_cli(["experiment=j1j2_square", "n_iter=2", "sampler.n_samples=64", "final_rounds=1", "exact=false",
             "observables=none", f"hydra.run.dir={tmp_path / 'run'}"], REPO, check=True)
    _script().main([str(tmp_path / "run")])
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert "(step 2): largest log|psi| of a stripe domain" in line and "E_loc there" in line
