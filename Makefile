# fleetbench: `make run` runs the main job on this machine, `make test` runs the tests.
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV := .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

.PHONY: help run ui test test-unit lint bench venv services test-services images smoke-image airflow-init clean fleet-celery fleet-edge

help:
	@echo "make run    - run fleet_benchmark once on the embedded default (local Docker, CPU smoke image) and print results"
	@echo "make ui     - Airflow's UI with the fleetbench view on this machine (prints the URL and login; Ctrl-C stops)"
	@echo "make test   - start what the tests need and run the test suite"
	@echo "make test-unit - the unit tests only (no services)"
	@echo "make venv   - the Python environment in .venv (make run, ui and test make it too)"
	@echo "make images - the CPU benchmark images (smoke, TensorFlow, PyTorch from PyPI: several GB; make test makes them)"
	@echo "make lint   - check the Python code with ruff (pyflakes, pycodestyle, import order)"
	@echo "make bench  - measure fleetbench itself"
	@echo "make fleet-celery - the CeleryExecutor deployment as local processes (two workers, REST API)"
	@echo "make fleet-edge   - the EdgeExecutor deployment as local processes (two edge workers, HTTPS only)"
	@echo "make clean  - remove .venv, .airflow and .data"

# requirements.lock pins every package to the set requirements.txt resolved to (Airflow's constraints file
# for 3.3.2, which lives on GitHub, generated here instead: scripts/lock-requirements.sh).
$(VENV)/.installed: requirements.txt requirements-dev.txt requirements.lock pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "[fleetbench] error: $(PYTHON) not found: install Python 3.11 (Debian: apt-get install python3 python3-venv)"; exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info[:2] >= (3, 11) else 1)' || { echo "[fleetbench] error: Python >= 3.11 needed, found $$($(PYTHON) --version)"; exit 1; }
	@# a venv without pip (made before python3-venv was installed) is made again, not reused
	@$(PY) -m pip --version >/dev/null 2>&1 || { rm -rf $(VENV); $(PYTHON) -m venv $(VENV); } || { rm -rf $(VENV); echo "[fleetbench] error: cannot create a venv: install python3-venv, then rerun"; exit 1; }
	@echo "[fleetbench] installing Python dependencies into $(VENV)"
	@$(PY) -m pip install -q --upgrade pip
	@$(PY) -m pip install -q -r requirements.txt -c requirements.lock
	@$(PY) -m pip install -q -r requirements-dev.txt -c requirements.lock
	@$(PY) -m pip install -q --no-deps -e .
	@touch $@

venv: $(VENV)/.installed

services:
	@bash scripts/ensure-docker.sh
	@bash scripts/ensure-registry.sh

test-services: services
	@bash scripts/ensure-postgres.sh
	@bash scripts/ensure-sshd.sh
	@bash scripts/ensure-registry-auth.sh
	@bash scripts/ensure-redis.sh
	@bash scripts/ensure-browser.sh
	@bash scripts/ensure-prometheus.sh
	@bash scripts/ensure-compose.sh

# The CPU smoke image (tf_cnn_benchmarks format), the torch_synthetic CPU image (PyTorch from PyPI, several
# GB the first time on a machine) and the real TensorFlow 2.15.1 CPU image; cached by their inputs.
images: smoke-image
	@bash include/images/torch-cpu/build.sh
	@bash include/images/tf-cpu/build.sh

smoke-image: services
	@bash include/images/cpu-smoke/build.sh

run: venv smoke-image
	@bash scripts/run.sh

# api-server, scheduler, dag-processor and triggerer as local processes (LocalExecutor, .airflow/).
ui: venv smoke-image
	@bash scripts/ui.sh

# The distributed setup without containers: PostgreSQL, Redis, api-server, scheduler, dag-processor and
# two Celery workers on different queues as local processes; fleet_benchmark triggered over the REST API.
fleet-celery: venv images test-services
	@bash scripts/test.sh -q tests/integration/test_celery_fleet.py tests/unit/test_compose_file.py

# GPU hosts that reach only the api-server over HTTPS: api-server (HTTPS), scheduler and dag-processor with
# the EdgeExecutor, and two edge workers on different queues as local processes; triggered over the REST API.
fleet-edge: venv smoke-image test-services
	@bash scripts/test.sh -q tests/integration/test_edge_fleet.py

lint: venv
	@$(VENV)/bin/ruff check .

test: venv lint images test-services
	@bash scripts/test.sh

bench: venv images test-services
	@$(PY) bench/run.py $(BENCH_ARGS)

test-unit: venv
	@$(VENV)/bin/pytest -q tests/unit -m "not integration"

clean:
	rm -rf $(VENV) .airflow .data
