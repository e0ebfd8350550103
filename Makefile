# `make demo` and `make test` work on a fresh machine with Python 3.10+ and make.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NODES ?= 32

.PHONY: demo test lint bench clean

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

test: $(STAMP)
	$(BIN)/ruff check agent tuimon tuimon_core tests bench
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -n 2

lint: $(STAMP)
	$(BIN)/ruff check agent tuimon tuimon_core tests bench
	$(BIN)/mypy
	$(BIN)/ruff format --check agent tuimon tuimon_core tests bench

bench: $(STAMP)
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
