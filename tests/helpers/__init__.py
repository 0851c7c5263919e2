"""What more than one test module uses: configs (config), the runner as a subprocess (cli), dense
references (dense), exact expectations over a small space (exact), random Jacobians (jacobians),
devices and processes (parallel), run setups and comparisons (runs), SLURM (slurm), the golden
runs (golden), all-pairs case sets (pairwise) and the compilation cache's directory (cache). A test
module imports from here, never from another test module (tests/test_test_layout.py); pytest
fixtures used by name stay in tests/conftest.py."""
