"""Every lattice kind with every Hamiltonian kind, small enough for dense matrices: each Hamiltonian as
runner.physics builds it and as the independent dense reference of tests/helpers/dense.py."""

from runner.physics import hamiltonians
from runner.physics import hilbert as hb
from tests.helpers.dense import dense_heisenberg, dense_ising, dense_pauli, dense_rotation


SMALL_LATTICES = {
    "chain4_pbc": lambda: hb.chain(4),
    "chain5_obc": lambda: hb.chain(5, pbc=False),
    "square2x2_pbc": lambda: hb.square(2),
    "triangular3_pbc": lambda: hb.triangular(3),
    "triangular2x3_obc": lambda: hb.triangular(Lx=2, Ly=3, pbc=False),
    "honeycomb2_pbc": lambda: hb.honeycomb(2),
    "honeycomb1x3_obc": lambda: hb.honeycomb(Lx=1, Ly=3, pbc=False),
    "kagome1x3_pbc": lambda: hb.kagome(Lx=1, Ly=3),
    "kagome1x2_obc": lambda: hb.kagome(Lx=1, Ly=2, pbc=False),
    "graph5": lambda: hb.graph(5, [[0, 1], [1, 2], [2, 3], [3, 4], [4, 0], [0, 2]], next_edges=[[1, 3], [1, 4]]),
}
PAULI_TERMS = [  # Y terms, complex coefficients (Hermitian once combined), explicit site tuples
    {"coeff": 0.7, "ops": "XY", "on": "bonds"},
    {"coeff": -0.4, "ops": "YX", "on": "bonds"},
    {"coeff": "0.3j", "ops": "XY", "on": [[0, 0], [1, 1]]},  # i X Y = -Z on one site
    {"coeff": 0.5, "ops": "ZXZ", "on": [[0, 1, 2], [2, 1, 0]]},
    {"coeff": -0.6, "ops": "Y", "on": "sites"},
    {"coeff": "0.25+0j", "ops": "ZZ", "on": "next_bonds"},
]


def _expand(lattice, terms):
    """The (coeff, ops, sites) list of a `pauli` config, expanded here independently."""
    out = []
    for t in terms:
        on = {"sites": [[i] for i in range(lattice.n_sites)], "bonds": lattice.bonds.tolist(),
              "next_bonds": lattice.next_bonds.tolist()}.get(t["on"], t["on"]) if isinstance(t["on"], str) else t["on"]
        out += [(complex(t["coeff"]), t["ops"], tuple(s)) for s in on]
    return out


def hamiltonian_and_dense(kind, lattice):
    """(PauliSum, dense H in the basis the PauliSum is written in)."""
    n = lattice.n_sites
    j2 = 0.0 if lattice.next_bonds_issue else 0.35
    if kind == "ising":
        return hamiltonians.ising(lattice, J=0.8, h=1.3), dense_ising(lattice.bonds, n, 0.8, 1.3)
    if kind == "heisenberg":
        ham = hamiltonians.heisenberg(lattice, J=1.1, J2=j2, phase_prior=None)
        H = dense_heisenberg(lattice.bonds, lattice.next_bonds, n, 1.1, j2)
    elif kind == "xxz":
        ham = hamiltonians.xxz(lattice, J=0.9, Delta=0.6, hz=0.3)
        H = dense_pauli([(0.9 * d, ops, tuple(b)) for b in lattice.bonds for d, ops in ((1, "XX"), (1, "YY"), (0.6, "ZZ"))]
                        + [(-0.3, "Z", (i,)) for i in range(n)], n)
    else:
        terms = PAULI_TERMS if not lattice.next_bonds_issue else PAULI_TERMS[:-1]
        ham = hamiltonians.pauli(lattice, terms)
        H = dense_pauli(_expand(lattice, terms), n)
    U = dense_rotation(ham.rotated or (), n)
    return ham, U @ H @ U
