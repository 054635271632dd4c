# iolstream — the two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export KAFKA_PORT ?= 19092
# 1: `make test` and `make container-test` may apt-get install podman, runc and debootstrap (as root) when
# missing (.ci/run sets it). Otherwise nothing is installed system-wide: the container stack runs where
# they are present and is skipped, with the reason, where they are not.
export IOLSTREAM_INSTALL_SYSTEM ?= 0

.PHONY: install lint format test test-busy test-fast test-cluster container-test demo kafka-start kafka-stop bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# The formatter and the linter (configured in pyproject.toml); `make test` fails on either.
lint: $(STAMP)
	$(VENV)/bin/ruff format --check --quiet iolstream tests scripts benchmarks
	$(VENV)/bin/ruff check --quiet iolstream tests scripts benchmarks

format: $(STAMP)
	$(VENV)/bin/ruff format --quiet iolstream tests scripts benchmarks
	$(VENV)/bin/ruff check --quiet --fix iolstream tests scripts benchmarks

# The whole suite, with a real local broker (started here unless IOLSTREAM_TEST_BOOTSTRAP names one); the secured
# broker and the three-node cluster are started by their own fixtures (tests/secure, tests/cluster). It runs in
# PYTEST_WORKERS processes (pytest-xdist; each module's tests in one of them, tests/conftest.py): most of the suite
# waits on brokers and worker processes, so two of them overlap those waits; PYTEST_WORKERS=0 runs it in one.
PYTEST_WORKERS ?= 2
test: $(STAMP) lint
	@if [ -z "$$IOLSTREAM_TEST_BOOTSTRAP" ]; then bash scripts/kafka.sh start; fi
	@status=0; \
	IOLSTREAM_TEST_BOOTSTRAP=$${IOLSTREAM_TEST_BOOTSTRAP:-127.0.0.1:$(KAFKA_PORT)} \
	  $(PY) -m pytest -q -m "not cluster_full" -n $(PYTEST_WORKERS) $(PYTEST_ARGS) || status=$$?; \
	if [ -z "$$IOLSTREAM_TEST_BOOTSTRAP" ]; then bash scripts/kafka.sh stop; fi; \
	exit $$status

# `make test` as on a machine busy with something else: two CPU-bound loops beside it (scripts/busy.sh: BUSY_NICE,
# default 19, a background job's priority; 0 for an equal's), stopped however the suite ends. CI runs `make test`.
test-busy: $(STAMP)
	@bash scripts/busy.sh $(MAKE) --no-print-directory test

# The compose stack in podman (tests/containers/test_container_stack.py, also part of `make test`, where it is
# skipped with the reason if podman cannot be had): with IOLSTREAM_INSTALL_SYSTEM=1 installs podman as root
# if missing, builds the images or reuses them (scripts/containers.sh), runs broker, worker, producer and
# Prometheus. Here a missing podman is a failure, not a skip.
container-test: $(STAMP)
	IOLSTREAM_CONTAINER_TEST=require $(PY) -m pytest -q -m container tests/containers/test_container_stack.py $(PYTEST_ARGS)

# Every leader-loss case on a three-node cluster (tests/cluster/; `make test` runs one of them). The fixture starts
# the cluster itself (scripts/kafka_cluster.sh, ports 19492-19497, ~1 GB of RAM) and wipes it at the end.
test-cluster: $(STAMP)
	$(PY) -m pytest -q -m cluster tests/cluster $(PYTEST_ARGS)

# Unit tests only (no broker).
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not kafka and not container" $(PYTEST_ARGS)

demo: $(STAMP)
	DATASET=$(DATASET) WORKERS=$(WORKERS) bash scripts/demo.sh

kafka-start:
	bash scripts/kafka.sh start

kafka-stop:
	bash scripts/kafka.sh stop

bench: $(STAMP)
	$(VENV)/bin/iolstream bench --suite core

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
