"""bench/run.py: the cases are the advertised experiments; timing, process settings and output are fair."""

import importlib.util
import json
import os
import statistics
import sys
from unittest import mock

import pytest

from runner.config.build import build
from runner.parallel import runtime
from tests.helpers.cli import REPO
from tests.helpers.config import compose_config

spec = importlib.util.spec_from_file_location("bench_run", REPO / "bench" / "run.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

EXPECTED = {  # case: (dtype, sites, samples, parameter count as in NetKet)
    "tfim1d": ("float64", 20, 1024, 440),
    "heis1d": ("complex128", 16, 1024, 560),
    "tfim2d": ("float64", 36, 2048, 1368),
    "gcnn_tri6": ("complex128", 36, 512, 27960),  # NetKet's GCNN: 27952, without our 8 readout weights
}


@pytest.mark.parametrize("case", sorted(bench.CASES))
def test_bench_case_is_the_advertised_experiment(case):
    overrides = [*bench.CASES[case], *bench.common(case)]
    keys = [o.split("=")[0] for o in overrides]
    assert len(keys) == len(set(keys)), f"an override is given twice: {overrides}"
    config = compose_config(overrides)
    experiment = build(config)
    dtype, n_sites, n_samples, n_params = EXPECTED[case]
    assert experiment.dtype_name == dtype
    assert experiment.hilbert.n_sites == n_sites
    assert experiment.problem.sampler.n_samples == n_samples and experiment.problem.sampler.n_chains == 16
    import jax
    import jax.numpy as jnp

    params = experiment.problem.model.init(jax.random.PRNGKey(0), jnp.ones((n_sites,), jnp.int8))["params"]
    assert sum(x.size for x in jax.tree_util.tree_leaves(params)) == n_params


def test_case_overrides_replace_the_step_count():
    short = bench.case_overrides("heis1d", 20)
    assert [o for o in short if o.startswith("n_iter=")] == ["n_iter=20"]
    assert bench.case_overrides("heis1d") == bench.CASES["heis1d"]
    assert bench.case_n_iter("tfim2d") == 150 and bench.case_n_iter("tfim2d", 20) == 20


def test_mean_step_seconds_is_total_time_over_timed_steps():
    # Step k ends at wall_N[k]; steps 1-10 are warm-up (slow compile), step 14 is an expensive one.
    durations = [5.0] + [0.3] * 9 + [0.1, 0.1, 0.1, 1.0, 0.1, 0.1]
    wall_N = [sum(durations[:k + 1]) for k in range(len(durations))]
    mean = bench.mean_step_seconds(wall_N, warmup=10)
    assert mean == pytest.approx(sum(durations[10:]) / 6)  # 0.25: the expensive step counts in full
    assert mean > 2 * statistics.median(durations[10:])  # a median would hide it
    assert bench.mean_step_seconds([1.0, 2.0, 4.0], warmup=1) == pytest.approx(1.5)
    with pytest.raises(ValueError):
        bench.mean_step_seconds(wall_N[:10], warmup=10)


class _Launched(Exception):
    pass


def test_netket_and_vmc_runner_processes_get_the_same_settings(monkeypatch):
    from runner.parallel.runtime import configure_runtime

    base = {"PATH": "/usr/bin", "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    env = bench.process_env(base)
    launched = []

    def launch(cmd, cwd, env):
        launched.append((cmd, env))
        raise _Launched

    monkeypatch.setattr(bench, "measured", launch)
    for run in (lambda: bench.run_vmc_runner("tfim2d", 36, n_iter=20, env=env),
                lambda: bench.run_netket("tfim2d", sys.executable, 36, driver="vmc_sr", n_iter=20, env=env)):
        with pytest.raises(_Launched):
            run()
    (ours_cmd, ours_env), (nk_cmd, nk_env) = launched
    assert ours_env == nk_env == env
    assert env["OPENBLAS_NUM_THREADS"] == "1" and "xla_cpu_small_while_loop_byte_threshold" in env["XLA_FLAGS"]
    assert env["XLA_FLAGS"].startswith("--xla_force_host_platform_device_count=2")  # the user's flags kept
    with mock.patch.dict(os.environ, env, clear=True):
        configure_runtime()  # what `python -m runner` does first: it must find nothing left to set
        assert dict(os.environ) == env
    assert "n_iter=20" in ours_cmd and "--n-iter=20" in nk_cmd and f"--warmup={bench.WARMUP}" in nk_cmd


def test_netket_processes_report_every_setting_we_compare():
    assert set(bench.process_settings({})) <= set(bench.REPORTED_ENV)


def test_a_netket_run_under_other_settings_is_refused(monkeypatch, tmp_path):
    env = bench.process_env({"PATH": "/usr/bin"})

    def netket_reporting(reported):
        line = {"env": reported, "s_per_iter": 0.1, "compile_plus_first_iter_s": 1.0, "final_energy": -1.0,
                "final_energy_error": 0.1}
        return lambda cmd, cwd, env: ("NetKet chatter\n" + json.dumps(line) + "\n", "", 100.0)

    monkeypatch.setattr(bench, "measured", netket_reporting({**env, "OPENBLAS_NUM_THREADS": None}))
    with pytest.raises(RuntimeError, match="OPENBLAS_NUM_THREADS"):
        bench.run_netket("tfim2d", sys.executable, 36, env=env)
    monkeypatch.setattr(bench, "measured", netket_reporting(env))
    assert bench.run_netket("tfim2d", sys.executable, 36, env=env)["s_per_iter"] == 0.1


def test_replace_section_keeps_the_rest_of_the_file():
    analysis = "## Accuracy\n\nhand-written analysis\n"
    first = bench.replace_section("# Benchmarks\n\nold table\n\n" + analysis, "# Benchmarks\n\nnew table\n")
    assert "old table" not in first and "new table" in first and first.endswith(analysis)
    assert first.startswith(bench.SECTION_START)
    second = bench.replace_section(first, "# Benchmarks\n\nnewer table")
    assert "new table" not in second and "newer table" in second and second.endswith(analysis)
    assert second.count(bench.SECTION_START) == 1 and second.count(bench.SECTION_END) == 1
    assert bench.replace_section("", "t") == f"{bench.SECTION_START}\nt\n{bench.SECTION_END}\n"


def _load(name):
    """A bench script as a module (bench/ on the path: the scripts import bench/run.py as `run`)."""
    sys.path.insert(0, str(REPO / "bench"))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("case", ["cnn", "vit"])
def test_deep_case_is_the_model_netket_gets(case):
    """bench/deep.py: our config builds the very module (same class and fields) that the NetKet side
    hands to MCState, on the 6 x 6 J1-J2 physics, with the same initial parameters for a seed."""
    import jax
    import jax.numpy as jnp

    deep = _load("deep")
    overrides = deep.overrides(case, n_iter=20, seed=3)
    keys = [o.split("=")[0] for o in overrides]
    assert len(keys) == len(set(keys)), f"an override is given twice: {overrides}"
    experiment = build(compose_config(overrides))
    problem, model = experiment.problem, deep.our_model(case)
    assert problem.model == model
    assert experiment.hilbert.n_sites == 36 and experiment.hilbert.total_sz == 0
    assert (problem.sampler.n_samples, problem.sampler.n_chains) == (deep.N_SAMPLES, deep.N_CHAINS)
    assert (problem.sampler.n_discard_per_chain, problem.sampler.sweep_size) == (deep.N_DISCARD, deep.SWEEP)
    assert experiment.settings.seed == 3 and experiment.settings.n_iter == 20
    ours = problem.model.init(deep.init_key(3), jnp.ones((36,), jnp.int8))["params"]
    theirs = model.init(deep.init_key(3), jnp.ones((36,), jnp.int8))["params"]
    assert jax.tree_util.tree_all(jax.tree_util.tree_map(lambda a, b: bool((a == b).all()), ours, theirs))
    from runner.core.vmc import init_state

    runner_params = init_state(problem, 3, jnp.ones((36,), jnp.int8)).params
    assert jax.tree_util.tree_all(jax.tree_util.tree_map(lambda a, b: bool((a == b).all()), runner_params, theirs))
    n_params = sum(x.size for x in jax.tree_util.tree_leaves(ours))
    assert n_params > deep.N_SAMPLES  # the sample-space solver's regime


def test_deep_variants_differ_only_in_what_they_name():
    """bench/deep.py: each variant's environment is the common one but for NetKet's device count
    and, for the `xla` variants, XLA's small-loop threshold in place of the runner's; every order
    runs each variant once; each code's best is its fastest variant and the ratio is theirs."""
    deep = _load("deep")
    env = bench.process_env()
    for name, (code, devices, xla_default) in deep.VARIANTS.items():
        changed = {k: v for k, v in deep.variant_env(name, env).items() if env.get(k) != v}
        expected = {}
        if code == "nk" and devices > 1:
            expected["NETKET_EXPERIMENTAL_SHARDING_CPU"] = str(devices)
        if xla_default:
            expected["XLA_FLAGS"] = env["XLA_FLAGS"].replace(
                f"xla_cpu_small_while_loop_byte_threshold={runtime.SMALL_LOOP_BYTES}", "xla_cpu_small_while_loop_byte_threshold=1024")
        assert changed == expected, name
    for rep in range(2):
        assert sorted(deep.run_order(rep)) == sorted(deep.VARIANTS)
    run = lambda t: {"s_per_iter": t, "compile_first": 1.0, "peak_rss_mb": 1.0, "n_params": 5}  # noqa: E731
    row = deep.summarise("cnn", {"vmc 1": [run(0.3)], "vmc 2": [run(0.2)], "nk 1": [run(0.5)], "nk 2 xla": [run(0.4)]})
    assert (row["vmc"], row["nk"]) == ("vmc 2", "nk 2 xla") and row["ratio"] == pytest.approx(0.5)


def test_deep_and_scaling_sections_replace_only_their_own_part(tmp_path):
    deep, scaling = _load("deep"), _load("scaling")
    text = "# Title\n\nintro\n\n## Other\n\nkept\n"
    path = tmp_path / "benchmarks.md"
    path.write_text(text)

    def write(script, section):
        bench.write_section(path, section, script.SECTION_START, script.SECTION_END)
        return path.read_text()

    write(deep, "## Deep\n\nfirst\n")
    once = write(scaling, "## Scaling\n\nA\n")
    assert once.startswith(text.rstrip("\n")) and "first" in once and "A" in once
    write(scaling, "## Scaling\n\nB\n")
    twice = write(deep, "## Deep\n\nsecond\n")
    assert "first" not in twice and "A\n" not in twice and "second" in twice and "B" in twice
    assert twice.count("## Other") == 1 and twice.count(deep.SECTION_START) == 1
    assert twice.count(scaling.SECTION_START) == 1
    assert write(deep, "## Deep\n\nsecond\n") == twice, "writing the same section again changes nothing"


def test_scaling_points_vary_one_knob_each():
    scaling = _load("scaling")
    points = scaling.plan(list(scaling.BLOCKS), 30)
    base = scaling.point_overrides(30)
    for block, value, overrides, layout in points:
        changed = set(overrides) - set(base)
        if block == "layouts":
            assert not changed and layout == value
        else:
            knob = {"samples": "sampler.n_samples", "params": "model.alpha", "sites": "hilbert.L"}[block]
            assert changed <= {f"{knob}={value}"} and layout == "single"
        experiment = build(compose_config(overrides))
        assert experiment.settings.n_iter == 30 and experiment.problem.sampler.n_chains == 16
    assert {v for b, v, _, _ in points if b == "layouts"} == set(scaling.LAYOUTS)


def test_noise_free_sr_sums_over_the_orbits_as_over_all_states(capsys):
    """bench/noise_free_sr.py: the orbit-weighted sum of local energies is the exact energy of the
    whole Sz = 0 sector (`runner.physics.exact.energy_of`, a sparse matvec on all 12,870 states)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from models import RBMSymm
    from runner.physics import exact, hamiltonians
    from runner.physics import hilbert as hb

    noise_free = _load("noise_free_sr")
    lattice = hb.square(4, total_sz=0)
    states, sizes, n_states = noise_free.orbits(lattice)
    assert (len(states), int(sizes.sum()), n_states) == (153, 12870, 12870)
    ham = hamiltonians.heisenberg(lattice, 1.0, 0.5, "marshall")
    model = RBMSymm(alpha=2, group="lattice", param_dtype=jnp.complex128, hilbert=lattice)
    params = model.init(jax.random.PRNGKey(0), states[0])["params"]
    params = jax.tree_util.tree_map(lambda x: 10 * x, params)
    w, eloc = noise_free.weighted_local_energies(ham, model, params, states, sizes)
    log_psi = np.asarray(model.apply({"params": params}, jnp.asarray(hb.all_states(lattice))))
    expected = exact.energy_of(ham, lattice, np.exp(log_psi - log_psi.real.max()))
    np.testing.assert_allclose(float(jnp.sum(w * eloc).real), expected, rtol=1e-12)
    noise_free.main(["--alpha", "1", "--steps", "2"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "alpha 1: 18 parameters; 153 orbits of 12870 configurations" and len(lines) == 4


def test_cnn_conv_bench_compares_the_formulations(capsys, monkeypatch):
    """bench/cnn_conv.py's forms are the CNN's log psi (so its timings compare the same function),
    and the script runs on a small case, every form and dtype."""
    import jax
    import jax.numpy as jnp

    from models.cnn import CNN
    from runner.physics import hilbert as hb

    conv_spec = importlib.util.spec_from_file_location("bench_cnn_conv", REPO / "bench" / "cnn_conv.py")
    conv_bench = importlib.util.module_from_spec(conv_spec)
    conv_spec.loader.exec_module(conv_bench)
    lattice = hb.square(3, total_sz=None)
    model = CNN(channels=2, depth=2, param_dtype=jnp.float64, hilbert=lattice)
    sigma = jnp.asarray(hb.all_states(lattice))[:100]
    params = model.init(jax.random.PRNGKey(0), sigma[:1])["params"]
    for form in ("xla", "windows", "dense", None):
        assert jnp.allclose(conv_bench.in_form(model, form)(params, sigma), model.apply({"params": params}, sigma),
                            rtol=1e-12, atol=1e-12)
    monkeypatch.setattr(sys, "argv", ["cnn_conv.py", "--L", "2", "--channels", "2", "--depth", "1",
                                      "--batches", "4", "70", "--derivatives", "4"])
    conv_bench.main()
    out = capsys.readouterr().out
    assert all(out.count(f"  {form} ") == 4 for form in ("xla", "windows", "dense", "chosen"))
    assert "complex64:" in out and out.count("log psi of 70:") == 16


def test_log_cosh_bench_compares_the_same_function(capsys, monkeypatch):
    """bench/log_cosh.py's two forms are the same log cosh (elementwise and inside the CNN, where
    the swap must reach the model), and the script runs on a small case."""
    import jax
    import jax.numpy as jnp

    from models.cnn import CNN
    from runner.physics import hilbert as hb

    spec = importlib.util.spec_from_file_location("bench_log_cosh", REPO / "bench" / "log_cosh.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    x = jnp.linspace(-30.0, 30.0, 1001)
    old, new = (fn(x) for fn in bench.FORMS.values())
    assert jnp.allclose(old, new, rtol=0, atol=1e-14)
    lattice = hb.square(3, total_sz=None)
    model = CNN(channels=2, depth=2, param_dtype=jnp.float64, hilbert=lattice)
    sigma = jnp.asarray(hb.all_states(lattice))[:100]
    params = model.init(jax.random.PRNGKey(0), sigma[:1])["params"]
    values = [bench.cnn_logpsi(model, form)(params, sigma) for form in bench.FORMS]
    assert jnp.allclose(*values, rtol=0, atol=1e-12) and not jnp.array_equal(*values)
    monkeypatch.setattr(sys, "argv", ["log_cosh.py", "--L", "4", "--channels", "2", "--depth", "1",
                                      "--elements", "1000", "--scan", "4", "3", "--batch", "20"])
    bench.main()
    out = capsys.readouterr().out
    assert out.count("XLA's log1p") == 3 and out.count("log1p_unit") == 3 and "max |log psi difference|" in out


def test_step_parts_times_the_runner_step_on_its_own_samples(capsys):
    """bench/step_parts.py: the four parts on a small config; the local energies it times are
    those the energy and update and the whole step estimate the energy from."""
    import numpy as np

    spec = importlib.util.spec_from_file_location("bench_step_parts", REPO / "bench" / "step_parts.py")
    step_parts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(step_parts)
    overrides = ["hilbert.L=8", "model.alpha=1", "sampler.n_samples=64", "sampler.n_chains=8"]
    out = step_parts.parts(step_parts.experiment_of(overrides), repeat=1)
    assert list(out) == ["draw", "local_energies", "energy_and_update", "vmc_step"]
    assert all(ms > 0 for ms, _ in out.values())
    energy = np.mean(np.asarray(out["local_energies"][1]))
    np.testing.assert_allclose(out["energy_and_update"][1][0].mean, energy, rtol=1e-12)
    np.testing.assert_allclose(out["vmc_step"][1][1]["energy"], energy, rtol=1e-12)
    step_parts.main(["--repeat", "1", *overrides])
    assert capsys.readouterr().out.count(" ms") == 4


spec_tdvp = importlib.util.spec_from_file_location("bench_tdvp", REPO / "bench" / "tdvp.py")
bench_tdvp = importlib.util.module_from_spec(spec_tdvp)
sys.path.insert(0, str(REPO / "bench"))  # tdvp.py imports run.py as its neighbour
try:
    spec_tdvp.loader.exec_module(bench_tdvp)
finally:
    sys.path.remove(str(REPO / "bench"))


def test_tdvp_bench_runs_the_quench_experiments_numerics():
    """bench/tdvp.py's constants are experiment=tfim_quench_1d's: integrator, dt, rcond, field,
    model and samples (the NetKet side takes the same values from it on its command line)."""
    config = compose_config(["experiment=tfim_quench_1d", "task.initial_state=plus_x"])
    task = config["task"]
    assert (task["integrator"]["_target_"].rpartition(".")[2], task["integrator"]["dt"], task["save_every"],
            task["equation"]["rcond"]) == ("rk4", bench_tdvp.DT, bench_tdvp.SAVE_EVERY, bench_tdvp.RCOND)
    assert config["hamiltonian"]["h"] == bench_tdvp.H and config["model"]["alpha"] == 2
    assert config["model"]["_target_"].endswith("RBMSymm") and config["sampler"]["n_samples"] == 4096
    assert config["hilbert"]["L"] == 40 and config["dtype"]["name"] == "complex128"


@pytest.mark.slow
def test_tdvp_bench_times_the_runners_quench(tmp_path):
    """bench/tdvp.py's side of the runner: the quench from the RBMSymm's plus_x, timed per unit of time,
    by RK4 tVMC and by projected tVMC."""
    args = bench_tdvp.argparse.Namespace(L=6, n_samples=64, t_end=0.1)
    for i, (ptvmc_dt, code) in enumerate(((None, "vmc-runner"), (0.05, "vmc-runner ptvmc dt=0.05"))):
        result = bench_tdvp.ours(args, tmp_path / f"run{i}", os.environ.copy(), ptvmc_dt=ptvmc_dt)
        assert result["code"] == code and result["saved_times"] == [0.0, 0.05, 0.1], code
        assert result["seconds_per_unit_time"] > 0


def test_equal_time_runs_our_six_by_six_recipes_and_judges_by_the_combined_error_bar():
    """bench/equal_time.py: our side is each problem's 6 x 6 recipe on 36 sites at Sz = 0 (its samples
    per step are what NetKet gets), and "ours lower" needs more than the combined error bar."""
    equal_time = _load("equal_time")
    for problem, overrides in equal_time.OURS.items():
        config = equal_time.composed(overrides)
        assert config["hilbert"]["L"] == 6 and config["hilbert"]["total_sz"] == 0, problem
        assert equal_time.recipe_samples(problem) == config["sampler"]["n_samples"] > 0
    ours = {"energy": -80.0, "energy_error": 0.03}
    assert equal_time.verdict(ours, {"energy": -79.9, "energy_error": 0.04})[2]  # 0.1 > 0.05
    assert not equal_time.verdict(ours, {"energy": -79.96, "energy_error": 0.04})[2]  # 0.04 < 0.05
