"""The symmetry sectors a trained wavefunction can lie in, measured, and the lowest exact level
among them: what tells a run that its model cannot reach the ground state.

A model is measured, not asked: psi(g s) / psi(s) over a few configurations s is one number c_g
for every symmetry g the wavefunction has (by weight sharing, a projection, or training), and
scatters for the others. Sectors whose characters disagree with a measured c_g are out of reach.
"""

import numpy as np

from runner.physics import symmetry
from runner.physics.spectrum import Spectrum

EIGEN_RTOL = 1e-6  # psi(g s) / psi(s) the same to this over every probe: psi is an eigenfunction of g


def eigenvalues(log_psi_S, log_psi_SxE, rtol: float = EIGEN_RTOL) -> list:
    """Per element e, the eigenvalue c_e of psi under it, or None where psi is none of its
    eigenfunctions.

    Args:
        log_psi_S: log psi of the probes s (complex or real).
        log_psi_SxE: log psi of their images g_e s.
    """
    log_psi_S, log_psi_SxE = np.asarray(log_psi_S, complex), np.asarray(log_psi_SxE, complex)
    keep = np.isfinite(log_psi_S) & (log_psi_S.real > np.max(log_psi_S.real[np.isfinite(log_psi_S)],
                                                                initial=-np.inf) - symmetry.SYMMETRY_ZERO_LOG)
    if not np.any(keep):
        return [None] * log_psi_SxE.shape[1]
    with np.errstate(all="ignore"):
        ratio_SxE = np.exp(log_psi_SxE[keep] - log_psi_S[keep, None])
    c_E = ratio_SxE[0]
    same = np.all(np.abs(ratio_SxE - c_E) <= rtol, axis=0) & (np.abs(np.abs(c_E) - 1) <= rtol)
    return [complex(c) if ok else None for c, ok in zip(c_E, same)]


def measure(log_psi_fn, probes_SxN, group: symmetry.SpaceGroup, flip: bool):
    """(c_E per element of `group`, the spin flip's eigenvalue or None): `eigenvalues` of the
    wavefunction `log_psi_fn` ([..., N] spins -> log psi [...]) on the configurations
    `probes_SxN` (a host array, e.g. the chains' last), their images, and (with `flip`) their
    flips."""
    probes_SxN = np.asarray(probes_SxN)
    log_psi_S = np.asarray(log_psi_fn(probes_SxN))
    c_E = eigenvalues(log_psi_S, np.asarray(log_psi_fn(probes_SxN[:, group.perm_ExN])))
    c_flip = eigenvalues(log_psi_S, np.asarray(log_psi_fn(-probes_SxN[:, None])))[0] if flip else None
    return c_E, c_flip


def _translation_phases(group: symmetry.SpaceGroup, momentum) -> np.ndarray:
    """exp(i k . t) on every element (the translation part of a character)."""
    return np.exp(2j * np.pi * group.shift_ExD @ (np.asarray(momentum) / np.asarray(group.extents)))


def reaches(group: symmetry.SpaceGroup, sector: symmetry.Sector, c_E: list, flip) -> bool:
    """Whether a state of `sector` (or of a sector degenerate with it, at a momentum of its star)
    agrees with every measured eigenvalue: c_E per element of `group`, `flip` the spin flip's."""
    if flip is not None and sector.parity is not None and round(flip.real) != sector.parity:
        return False
    translations = [e for e, op in enumerate(group.op_E) if op == 0 and c_E[e] is not None]
    measured = np.array([c_E[e] for e in translations])
    for k in symmetry.star(group, sector.momentum):
        if not np.allclose(_translation_phases(group, k)[translations], measured, atol=1e-6):
            continue
        if tuple(k) != tuple(sector.momentum):
            return True  # the irrep's name is not carried over to another star member: agree
        elements, chi = symmetry.characters(group, sector)
        return all(c_E[e] is None or abs(c_E[e] - x) <= 1e-6 for e, x in zip(elements, chi))
    return False


def reachable_energy(result: Spectrum, group: symmetry.SpaceGroup, c_E: list, flip) -> float | None:
    """The lowest exact level among the sectors the measured eigenvalues allow; None when psi has
    no symmetry beyond the identity (every state, 2-D irreps included, is within reach)."""
    if flip is None and all(c is None for c in c_E[1:]):
        return None
    levels = [v[0] for s, v in result.levels.items() if v and reaches(group, s, c_E, flip)]
    return min(levels) if levels else None


def misses_ground(summary: dict, rtol: float = 1e-8) -> bool:
    """Whether the lowest level the run's wavefunction can reach (`sector_exact_energy`) lies above
    the exact ground energy by more than `rtol` of it (the two solvers agree to about 1e-13)."""
    e0, e_s = summary.get("exact_energy"), summary.get("sector_exact_energy")
    return e0 is not None and e_s is not None and e_s - e0 > rtol * abs(e0)


def check(summary: dict, rtol: float = 1e-8):
    """("sector", message) when the lowest level the run's wavefunction can reach lies above the
    exact ground energy: its symmetry keeps it out of the ground state's sector."""
    if not misses_ground(summary, rtol):
        return None
    e0, e_s = summary["exact_energy"], summary["sector_exact_energy"]
    where = f"sector {summary['sector']}" if summary.get("sector") else "the sectors its symmetry allows"
    ground = summary.get("exact_sector") or "a two-dimensional irrep"
    return ("sector", f"the wavefunction lies in {where}, whose lowest exact level is {e_s:.8f}; the ground "
            f"state lies in {ground} at {e0:.8f}: this run cannot reach it (model.sector=auto projects onto "
            "the ground state's sector)")
