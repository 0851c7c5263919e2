"""Layout invariance, program by program: each jitted program of the core compiled under a mesh of
1 device and of 4 (as the runner compiles it), on the same inputs, gives the same bits in every
output leaf. The programs: one VMC step of each preconditioner (SR dense and CG, minSR dense and
with its kernel in chunks and parameter blocks, none), of the excited-state (determinant) model, and
of a full sum; the sampler's draws (Metropolis local and exchange, exact, full sum); the TDVP time
derivative and a projected tVMC step, sampled and by full sum; the final estimate. Two-process runs
per task: tests/integration/test_parallel.py and test_tasks_parallel.py."""

import jax
import jax.numpy as jnp
import pytest

from runner.config.build import build
from runner.core import ptvmc, tdvp
from runner.core.estimate import estimate
from runner.core.problem import draw
from runner.core.vmc import init_state, vmc_step
from tests.helpers.config import compose_config
from tests.helpers.parallel import assert_same_bits, on_one_and_four_devices
from tests.helpers.runs import EXCITED_TINY, QUENCH, QUENCH_SAMPLED

# Known to differ in the last bits on some shapes (docs/notes/layouts.md, 2026-12-02): a sum over the
# samples of each chain (`jnp.sum(x_CxTxP, axis=1)` in chain_mean) is emitted by XLA:CPU in an order that
# depends on how many chains a device holds (8 chains of 16 samples, P = 80: not sequential on 1
# device, sequential on 4), and the model's products over a batch of 2 chains' configurations differ
# from those over 8 (the Jastrow's product with [10, 36] against [40, 36] rows).
LAYOUT_DEPENDENT = pytest.mark.xfail(strict=False, raises=AssertionError,
                                     reason="per-chain sums and model batches follow the layout")
SMALL = ["sampler.n_samples=128", "sampler.n_chains=8", "exact=false"]
HEISENBERG = ["hilbert.L=8", "hilbert.total_sz=0", "hamiltonian=heisenberg", "sampler=metropolis_exchange",
              "dtype=complex128"]
# One VMC step (draw, local energies, log-derivatives, preconditioner, optimizer) per program.
STEPS = {
    "sr_dense": ["hilbert.L=8", "model=rbm", "sampler.n_samples=256"],  # 128: LAYOUT_DEPENDENT
    "sr_cg": ["hilbert.L=8", "model=rbm", "preconditioner.solver=cg"],
    "minsr_dense": [*HEISENBERG, "preconditioner=minsr"],
    "minsr_chunked": [*HEISENBERG, "model.alpha=4", "preconditioner=minsr", "chunk_size=32",
                      "preconditioner.param_chunk_size=64", "preconditioner.momentum=0.9"],
    "none_mlp": ["hilbert.L=6", "hamiltonian=heisenberg", "model=mlp", "model.hidden=[6]", "optimizer=adam",
                 "preconditioner=none"],
    "excited": [*EXCITED_TINY, "sampler.n_samples=128", "sampler.n_chains=8"],
    "full_sum": ["sampler=full_sum", "hilbert.L=6", "sampler.n_chains=8"],
}
SAMPLERS = {
    "metropolis_local": ["hilbert.L=8"],
    "metropolis_exchange": HEISENBERG,
    "exact": ["hilbert.L=6", "sampler=exact"],
    "full_sum": ["sampler=full_sum", "hilbert.L=6"],
}


def _experiment(overrides):
    experiment = build(compose_config([*SMALL, *overrides]))
    sigma_N = jnp.ones((experiment.problem.sampler.hilbert.n_sites,), jnp.int8)  # K N sites: task=excited
    state = init_state(experiment.problem, 0, sigma_N)
    return experiment, state


@pytest.mark.parametrize("name", sorted(STEPS))
def test_a_step_is_the_same_on_one_and_four_devices(name):
    experiment, state = _experiment(STEPS[name])
    one, four = on_one_and_four_devices(lambda s: vmc_step(experiment.problem, s), state)
    assert_same_bits(four, one)


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_a_draw_is_the_same_on_one_and_four_devices(name):
    experiment, state = _experiment(SAMPLERS[name])
    one, four = on_one_and_four_devices(lambda s: draw(experiment.problem, s.params, s.chains), state)
    assert_same_bits(four, one)


def _time_derivative(overrides):
    """theta_dot and the chains after its draw, of the quench (a 6-site Ising chain, Jastrow), on 1 and
    on 4 devices."""
    experiment, state = _experiment([*QUENCH_SAMPLED, *overrides])
    f = tdvp.time_derivative(experiment.problem, tdvp.tdvp())
    return on_one_and_four_devices(lambda s: f(0.0, s["params"], s["chains"]),
                                   {"params": state.params, "chains": state.chains})


@LAYOUT_DEPENDENT
def test_the_tdvp_time_derivative_is_the_same_on_one_and_four_devices():
    """The sampled quench's theta_dot (8 chains of 8 samples)."""
    one, four = _time_derivative([])
    assert_same_bits(four, one)


def test_the_final_estimate_is_the_same_on_one_and_four_devices():
    experiment, state = _experiment(["hilbert.L=8", "model=rbm"])
    one, four = on_one_and_four_devices(lambda s: estimate(experiment.problem, s, 2), state)
    assert_same_bits(four, one)


def test_the_tdvp_time_derivative_by_full_sum_is_the_same_on_one_and_four_devices():
    """The quench's theta_dot by the full sum (the configurations split over the devices)."""
    one, four = _time_derivative(["sampler=full_sum"])
    assert_same_bits(four, one)


def _projected_step(overrides):
    """One projected tVMC step of the quench (its draws, infidelity estimates and natural-gradient
    updates) on 1 and on 4 devices."""
    experiment, state = _experiment([*QUENCH, "sampler=metropolis_local", "sampler.n_samples=64", "sampler.n_chains=8",
                                     *overrides, "task/integrator=ptvmc", "task.integrator.dt=0.05",
                                     "task.integrator.max_iterations=3"])
    task = experiment.settings.task

    def one_step(s):
        start = ptvmc.init(task.integrator, 0.0, s["params"], s["chains"])
        return ptvmc.step(experiment.problem, task.integrator, task.real_time, s["params"], start, 1.0)

    return on_one_and_four_devices(one_step, {"params": state.params, "chains": state.chains})


def test_a_projected_step_by_full_sum_is_the_same_on_one_and_four_devices():
    one, four = _projected_step(["sampler=full_sum"])
    assert_same_bits(four, one)


@LAYOUT_DEPENDENT
def test_a_sampled_projected_step_is_the_same_on_one_and_four_devices():
    """The sampled quench's step: its per-chain sums are those that make the TDVP derivative's follow the layout."""
    one, four = _projected_step([])
    assert_same_bits(four, one)
