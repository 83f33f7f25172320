# Developer entry points. Install steps are idempotent: a stamp file records the last
# pip install, so repeated `make test` / `make run` skip straight to the work.
.DEFAULT_GOAL := help
SHELL := /bin/bash

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.tensorant-installed
AZURITE := node_modules/.bin/azurite
INSTALL_LOG := $(VENV)/install.log

.PHONY: help install run test lint bench

help:
	@echo "make run    Azurite + the function app on http://localhost:7071 (local compute and storage)"
	@echo "make test   the test suite (starts its own Azurite)"
	@echo "make lint   ruff + mypy"
	@echo "make bench  benchmarks (tests/bench)"

$(PY):
	$(PYTHON) -m venv $(VENV)

# Re-install when a pyproject.toml changes; output goes to a log shown only on failure.
# The app, and the two tools beside it (tools/: never deployed): the CLI and the dev host.
$(STAMP): pyproject.toml tools/cli/pyproject.toml tools/devhost/pyproject.toml | $(PY)
	@echo "Installing Python dependencies into $(VENV)..."
	@$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]' -e tools/cli -e tools/devhost \
		>$(INSTALL_LOG) 2>&1 \
		|| { cat $(INSTALL_LOG); exit 1; }
	@touch $@

# Only when Azurite is missing (no prerequisite: a newer package.json alone does not reinstall).
$(AZURITE):
	@echo "Installing Azurite (npm)..."
	@npm install --no-audit --no-fund --silent

install: $(STAMP) $(AZURITE)

run: install
	$(PY) -m tensorant_devhost.run

test: install
	$(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# Benchmarks: not part of `make test`; each prints ratios (this machine is noisy).
bench: install
	$(PY) -m tests.bench.import_bench
	$(PY) -m tests.bench.overhead_bench
	$(PY) -m tests.bench.sweeper_bench
