"""What more than one test module uses: configs (config), the runner as a subprocess (cli), dense
references (dense), exact expectations over a small space (exact), random Jacobians (jacobians),
devices and processes (parallel), run setups and comparisons (runs), SLURM (slurm) and the golden
runs (golden). A test module imports from here, never from another test module
(tests/test_test_layout.py); pytest fixtures used by name stay in tests/conftest.py."""
