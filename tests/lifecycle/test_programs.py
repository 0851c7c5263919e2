"""runner.lifecycle.programs: a run whose programs are an earlier run's in this process (here: another seed)
compiles nothing and gives the numbers it gives when it compiles; a program that differs compiles."""

import json

from runner import app
from runner.config.build import build
from runner.lifecycle import programs
from runner.parallel import mesh
from tests.helpers.config import compose_config

SMALL = ["hilbert.L=6", "sampler.n_samples=64", "sampler.n_chains=8", "n_iter=3", "exact=false", "peak_search=0",
         "final_rounds=2"]


def _run(overrides, run_dir):
    app.execute(build(compose_config([*SMALL, *overrides])), mesh.make_mesh("single"), run_dir)
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _numbers(records):
    return [{k: v for k, v in r.items() if k != "wall_time"} for r in records]


def test_another_seed_reuses_the_programs_and_gives_the_same_numbers(tmp_path):
    programs.clear()
    before = programs.counts["compiled"]
    _run(["seed=1"], tmp_path / "first")
    compiled, reused = programs.counts["compiled"], programs.counts["reused"]
    second = _run(["seed=2"], tmp_path / "second")
    assert programs.counts["compiled"] == compiled and programs.counts["reused"] - reused == compiled - before > 0
    programs.clear()
    again = _run(["seed=2"], tmp_path / "again")
    assert programs.counts["compiled"] - compiled == compiled - before
    assert _numbers(again) == _numbers(second)
    assert json.loads((tmp_path / "again" / "summary.json").read_text())["energy"] == \
        json.loads((tmp_path / "second" / "summary.json").read_text())["energy"]


def test_another_problem_compiles_its_own_programs(tmp_path):
    programs.clear()
    _run([], tmp_path / "first")  # the programs of this config, compiled or from an earlier test's run
    compiled = programs.counts["compiled"]
    _run(["hamiltonian.h=0.5"], tmp_path / "other")
    # the update (local energies of another H) is new; the draw of samples from psi is the same program
    assert programs.counts["compiled"] == compiled + 1
