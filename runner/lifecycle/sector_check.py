"""The exact levels by symmetry sector (spectrum.json) and the summary's sector fields: which
sector holds the ground state, which sector the run's model is in, and the lowest level it can
reach there."""

import json
import logging

import jax
import jax.numpy as jnp

from runner.diagnostics import sectors
from runner.lifecycle import rundir
from runner.parallel import distributed, mesh
from runner.physics import spectrum, symmetry
from runner.physics.exact import wants_exact, wants_sectors

log = logging.getLogger(__name__)

SPECTRUM_MAX_STATES = 2**16  # a model without a sector gets the spectrum by sector up to this many states
FIELDS = ("exact_sector", "sector", "sector_exact_energy", "sector_relative_error")


def exact_spectrum(experiment):
    """(`runner.physics.spectrum.Spectrum`, (ground sector or None, ground energy)) where the exact
    spectrum by sector runs (`exact.wants_sectors`) on a lattice with a space group whose symmetry
    the Hamiltonian has, and the model has a sector, or the space holds at most SPECTRUM_MAX_STATES
    states, or the whole space's Lanczos does not run (the spectrum then gives the exact energy and
    the sector of a model without one, e.g. a CNN beyond 2^20 states); else None. With
    `model.sector: auto` it is the spectrum the build resolved the sector from, not a second one
    (`runner.physics.spectrum.spectrum` keeps it for the same Hamiltonian and space). Computed on
    process 0 and sent to the others (a collective where it applies)."""
    hilbert = experiment.hilbert
    if not wants_sectors(experiment.settings.exact, hilbert) or hilbert.space_group is None:
        return None
    if experiment.sector is None and hilbert.n_states > SPECTRUM_MAX_STATES and wants_exact(experiment.settings.exact,
                                                                                           hilbert):
        return None  # the whole space's Lanczos gives the exact energy; the sectors would only add their cost
    if distributed.process_count() > 1:
        return distributed.broadcast_object(_spectrum(experiment) if distributed.is_main() else None)
    return _spectrum(experiment)


def _spectrum(experiment):
    """`exact_spectrum`'s value, computed here."""
    hilbert = experiment.hilbert
    try:
        result = spectrum.spectrum(experiment.hamiltonian, hilbert)
    except ValueError as err:  # a Hamiltonian without the lattice's symmetry has no sectors
        log.info("no spectrum by sector: %s", err)
        return None
    return result, spectrum.ground_sector(experiment.hamiltonian, hilbert, result)


def measured_eigenvalues(experiment, state, group: symmetry.SpaceGroup, log_psi=None):
    """`runner.diagnostics.sectors.measure` of `log_psi` ((params, [..., N] spins) -> log psi; None:
    the model's) on the chains' configurations at `state`'s parameters, each chain's configuration
    cut into N-site ones (task=excited's chains hold K copies). A collective: every process calls it."""
    log_psi = jax.jit(experiment.problem.logpsi if log_psi is None else log_psi)
    params = mesh.to_host(state.params)  # host copies: evaluated locally on every process alike
    probes = mesh.to_host(state.chains.sigma_CxN).reshape(-1, experiment.hilbert.n_sites)
    return sectors.measure(lambda s: log_psi(params, jnp.asarray(s)), probes, group,
                           bool(symmetry.parities(experiment.hilbert)))


def fields(experiment, state, found, exact_energy) -> dict:
    """The summary's sector fields (`FIELDS`), each None where unknown; `found` is
    `exact_spectrum`'s result."""
    sector = experiment.sector.name if experiment.sector is not None else None
    out = dict.fromkeys(FIELDS)
    out["sector"] = sector
    if found is None or exact_energy is None:
        return out
    result, (ground, _) = found
    group = symmetry.space_group(experiment.hilbert)
    c_E, flip = measured_eigenvalues(experiment, state, group)
    reach = sectors.reachable_energy(result, group, c_E, flip)
    out["exact_sector"] = ground.name if ground is not None else None
    out["sector_exact_energy"] = exact_energy if reach is None else reach
    return out


def relative_error(out: dict, energy) -> dict:
    """`out` with sector_relative_error: the energy's against sector_exact_energy."""
    e_s = out.get("sector_exact_energy")
    if energy is not None and e_s:
        out["sector_relative_error"] = abs(energy - e_s) / abs(e_s)
    return out


def write(run_dir, found) -> None:
    """Process 0 writes spectrum.json (`runner.physics.spectrum.to_json`) when there is a spectrum."""
    if found is not None and distributed.is_main():
        (run_dir / rundir.SPECTRUM).write_text(json.dumps(spectrum.to_json(*found), indent=1) + "\n")


def check_start(experiment, state, found, exact_energy):
    """Before the first step: the `sector` warning (`runner.diagnostics.sectors.check`), logged,
    when the starting wavefunction's symmetry (weight sharing, `model.sector`) keeps it out of the
    ground state's sector; returns it or None. `found` is `exact_spectrum`'s result, computed once
    for the whole run. A collective where there is a spectrum: every process calls it."""
    if found is None or exact_energy is None:
        return None
    warning = sectors.check({**fields(experiment, state, found, exact_energy), "exact_energy": exact_energy})
    if warning is not None:
        held = ("model.sector holds it there" if experiment.sector is not None else
                "measured on the starting parameters: a model that does not enforce this symmetry may leave it")
        log.warning("sector warning before the first step: %s (%s)", warning[1], held)
    return warning
