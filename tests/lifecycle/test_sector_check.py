"""runner.lifecycle.sector_check: a run's exact spectrum by sector is the one its build computed for
`model.sector: auto`, so every sector is diagonalised once per run."""

from omegaconf import OmegaConf

from runner.config import compose
from runner.config.build import build
from runner.lifecycle import sector_check
from runner.physics import exact, spectrum

# A 2 x 2 kagome Heisenberg model in S^z = 0 whose small CNN projects onto the exact ground sector.
KAGOME_AUTO = ["hilbert=kagome", "hilbert.L=2", "hilbert.total_sz=0", "hamiltonian=heisenberg",
               "sampler=metropolis_exchange", "model=cnn", "model.channels=2", "model.sector=auto", "exact=auto"]


def _config(overrides) -> dict:
    return OmegaConf.to_container(compose.compose(overrides), resolve=True)


def _counted(monkeypatch, module, name) -> list:
    """The calls of `module.name` from now on, one entry (its first argument) each."""
    calls, real = [], getattr(module, name)

    def counting(*args, **kwargs):
        calls.append(args[0] if args else None)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counting)
    return calls


def test_the_build_and_the_run_diagonalise_each_sector_once(monkeypatch):
    """The build resolves `auto` from the spectrum by sector; the run's spectrum.json and sector
    fields (`exact_spectrum`) are that spectrum, not a second one: one sector matrix and one call
    of the sparse eigensolver (Lanczos for the one level, every sector past the dense threshold here)
    per sector."""
    monkeypatch.setattr(spectrum, "_calls", [])  # nothing kept from an earlier test
    monkeypatch.setattr(exact, "DENSE_MAX_STATES", 2)
    matrices = _counted(monkeypatch, spectrum, "_sector_matrix")
    solved = _counted(monkeypatch, exact, "lanczos_ground_energy")
    experiment = build(_config(KAGOME_AUTO))
    result, (ground, energy) = sector_check.exact_spectrum(experiment)
    sparse = [s for s, d in result.dims.items() if d > 3]  # n_levels >= d - 1 stays dense
    assert len(matrices) == len(result.levels) and len(solved) == len(sparse) > 0
    assert ground == experiment.sector and energy == min(v[0] for v in result.levels.values() if v)


def test_a_sweep_s_points_share_a_spectrum_and_another_hamiltonian_gets_its_own(monkeypatch):
    """The kept spectrum belongs to what the Hamiltonian and the space hold, not to the objects: the
    next point of a sweep run in one process (built again from the same physics) diagonalises
    nothing; a point with another coupling gets its own spectrum."""
    monkeypatch.setattr(spectrum, "_calls", [])
    first = build(_config(KAGOME_AUTO))
    matrices = _counted(monkeypatch, spectrum, "_sector_matrix")
    again = build(_config([*KAGOME_AUTO, "optimizer.learning_rate=0.02"]))
    assert again.hamiltonian is not first.hamiltonian and again.hilbert is not first.hilbert
    assert sector_check.exact_spectrum(again) == sector_check.exact_spectrum(first) and matrices == []
    other = build(_config([*KAGOME_AUTO, "hamiltonian.J2=0.1"]))
    ours, theirs = sector_check.exact_spectrum(first), sector_check.exact_spectrum(other)
    assert len(matrices) == len(theirs[0].levels) and ours[0].levels != theirs[0].levels


def test_with_several_processes_process_0_computes_the_spectrum_and_sends_it(monkeypatch):
    """Process 0 diagonalises; another process computes nothing and receives process 0's spectrum
    (`distributed.broadcast_object`, here with the broadcast standing in for the collective)."""
    from runner.parallel import distributed

    experiment = build(_config([*KAGOME_AUTO[:-2], "model.sector=null", "exact=auto"]))
    monkeypatch.setattr(spectrum, "_calls", [])
    expected = sector_check.exact_spectrum(experiment)
    sent = []
    monkeypatch.setattr(distributed, "process_count", lambda: 2)
    monkeypatch.setattr(distributed, "broadcast_object", lambda x: sent.append(x) or expected)
    monkeypatch.setattr(distributed, "is_main", lambda: False)
    computed = _counted(monkeypatch, sector_check, "_spectrum")
    assert sector_check.exact_spectrum(experiment) == expected and computed == [] and sent == [None]
    monkeypatch.setattr(distributed, "is_main", lambda: True)
    assert sector_check.exact_spectrum(experiment) == expected and len(computed) == 1 and sent[1] == expected


def test_broadcast_object_on_one_process_is_the_object():
    from runner.parallel import distributed

    value = {"levels": [1.5, -2.0], "name": "k=(0,0)"}
    assert distributed.broadcast_object(value) == value


def test_a_model_without_a_sector_gets_the_spectrum_where_the_whole_space_lanczos_does_not_run(monkeypatch):
    """Past SPECTRUM_MAX_STATES a model without a sector (a CNN) gets the spectrum by sector only where it is the
    run's one exact energy: past the whole space's Lanczos limit (the Monte Carlo set-up on 24-site tori)."""
    monkeypatch.setattr(sector_check, "SPECTRUM_MAX_STATES", 100)  # kagome 2 x 2 at Sz = 0: 924 states
    experiment = build(_config([*KAGOME_AUTO, "model.sector=null"]))
    assert experiment.sector is None and sector_check.exact_spectrum(experiment) is None
    monkeypatch.setattr(exact, "AUTO_MAX_STATES", 100)
    result, (ground, energy) = sector_check.exact_spectrum(experiment)
    assert abs(energy - exact.ground_energy(experiment.hamiltonian, experiment.hilbert)) < 1e-10
    assert ground in result.levels and min(result.levels[ground]) == energy
