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

# Re-install when pyproject.toml changes; output goes to a log shown only on failure.
$(STAMP): pyproject.toml | $(PY)
	@echo "Installing Python dependencies into $(VENV)..."
	@$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]' >$(INSTALL_LOG) 2>&1 \
		|| { cat $(INSTALL_LOG); exit 1; }
	@touch $@

# Only when Azurite is missing (no prerequisite: a newer package.json alone does not reinstall).
$(AZURITE):
	@echo "Installing Azurite (npm)..."
	@npm install --no-audit --no-fund --silent

install: $(STAMP) $(AZURITE)

run: install
	$(PY) -m shared.devhost.run

test: install
	$(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# Benchmarks live in tests/bench: a `python -m tests.bench` entry point if there is one,
# else every tests/bench/*_bench.py module (each runnable with -m), else pytest files there.
bench: install
	@if [ -f tests/bench/__main__.py ]; then $(PY) -m tests.bench; \
	elif ls tests/bench/*_bench.py >/dev/null 2>&1; then \
		for f in tests/bench/*_bench.py; do m=$$(basename $$f .py); echo "== tests.bench.$$m"; \
			$(PY) -m tests.bench.$$m || exit 1; done; \
	elif [ -d tests/bench ]; then $(PY) -m pytest tests/bench -q -s; \
	else echo "no benchmarks yet: tests/bench does not exist"; fi
