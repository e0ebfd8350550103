# `make demo` and `make test` work on a fresh machine with Python 3.10+ and make.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NODES ?= 32

.PHONY: demo test test-ml lint bench clean

# Reinstall when the project's metadata changes (the stamp is older than pyproject.toml).
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

# The seed incident: a leaf loses spine capacity a minute in; watch tuimon catch it.
SCENARIO ?= spine-imbalance
demo: $(STAMP)
	$(BIN)/tuimon demo --nodes $(NODES) --scenario $(SCENARIO) --fault-at 60

# Four workers on two cores: most tests wait on sockets, subprocesses and real servers
# rather than compute (a run at -n 2 kept the cores under half busy). On the same
# machine in one hour the suite took 9.1 minutes at -n 3 and 7.5 at -n 4.
test: $(STAMP)
	$(BIN)/ruff check agent tuimon tuimon_core tests bench examples
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -n 4

# The training-framework examples (examples/) against the real packages, on the CPU:
# torch, PyTorch Lightning and Hugging Face transformers, in a separate environment
# (gigabytes: `make test` skips these tests, saying so). TORCH picks the build, e.g.
# TORCH='torch==2.13.0' where a CPU wheel of it is at hand.
ML_VENV := .venv-ml
TORCH ?= torch
test-ml:
	@test -x $(ML_VENV)/bin/python || $(PYTHON) -m venv $(ML_VENV)
	$(ML_VENV)/bin/python -m pip install --quiet -e '.[test]' '$(TORCH)' lightning transformers accelerate
	$(ML_VENV)/bin/python -m pytest -q -p no:xdist -rs tests/test_framework_callbacks.py

# The style is ruff's lint rules (pyproject.toml) and mypy, as `make test` checks them.
# The code is laid out by hand, not by a formatter: `ruff format` would rewrite most
# files (tables and aligned continuations), so it is not a check here.
lint: $(STAMP)
	$(BIN)/ruff check agent tuimon tuimon_core tests bench examples
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) $(ML_VENV) .pytest_cache .ruff_cache .hypothesis
