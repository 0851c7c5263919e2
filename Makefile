# Set-up on a fresh machine with Python 3.11 and pip: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

.PHONY: install run test clean

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

test: $(TEST_STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) outputs multirun
