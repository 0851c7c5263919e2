# Set-up on a fresh machine with Python 3.11 and pip: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

.PHONY: install run test test-fast clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e .
	touch $@

$(TEST_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test]'
	touch $@

run: $(STAMP)
	$(PY) -m runner $(ARGS)

# Two pytest workers (pytest-xdist), each taking whole test files (the SLURM tests stay in one
# worker, in order): XLA compiles on one core, so two workers keep both cores busy.
# `make test TEST_WORKERS=0` runs in one process.
TEST_WORKERS ?= 2
test: $(TEST_STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The unit tests only: tests/ without tests/integration/ and without tests marked slow.
test-fast: $(TEST_STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile -m "not slow" --ignore=tests/integration $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) outputs multirun

# A local SLURM for the SLURM launcher and its tests (docs/parallel.md). Root only; installs the
# Debian packages when missing. `SLURM_NODES=2 make slurm-up` emulates two nodes.
# Use it from a shell with: eval "$(make -s slurm-env)"
.PHONY: slurm-up slurm-down slurm-env

slurm-up:
	bash scripts/slurm/up.sh

slurm-down:
	bash scripts/slurm/down.sh

slurm-env:
	@bash scripts/slurm/env.sh
