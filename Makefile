# RocketQ developer targets. Everything runs from the project virtualenv in .venv, which
# `make setup` creates from scratch, so these work on a machine that has never seen the project.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The official RocketMQ 5 Python SDK in its own environment: the gateway's tests run it as a
# separate application, and tools/gen_protos.py --v2 generates the gateway's classes from it.
RMQ5_VENV := .venv-rmq5
RMQ5_SDK  := rocketmq-python-client==5.1.2

IMAGE ?= localhost/rocketq:dev

.PHONY: image setup demo demo-store check lint fmt typecheck test test-unit bench dashboard gen-protos verify-protos clean
.PHONY: bench-peers

$(STAMP): pyproject.toml tests/integration/v2_apps/node/package-lock.json
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) (Python 3.11) on PATH"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	sh tools/install_etcd.sh
	sh tools/install_podman.sh
	sh tools/install_java.sh
	test -x $(RMQ5_VENV)/bin/python || $(PYTHON) -m venv $(RMQ5_VENV)
	$(RMQ5_VENV)/bin/python -m pip install --quiet '$(RMQ5_SDK)'
	$(PY) tools/gen_protos.py --v2
	sh tools/install_node.sh
	touch $(STAMP)

setup: $(STAMP)  ## create .venv and install RocketQ with its dev tools

demo: setup  ## start a local RocketQ (nameserver + broker), show a produce/consume round trip; Ctrl-C stops
	$(VENV)/bin/rocketq dev up --dir .rocketq-dev

demo-store: setup  ## write a small demo store through the engine and inspect it with the store tool
	$(PY) -m tools.demo_store demo-store
	$(VENV)/bin/rocketq store dump demo-store --limit 5
	$(VENV)/bin/rocketq store verify demo-store

check: setup verify-protos lint test  ## what CI runs: protos in step, lint clean, every test

lint: setup  ## ruff lint + format check, mypy on hand-written code, import-linter layering contracts
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

fmt: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# Two workers, each taking whole test modules (--dist loadfile), so a module's cluster fixture is
# started once: most tests wait on server processes, and CI has 2 cores. TEST_WORKERS=0 runs
# everything in one process.
TEST_WORKERS ?= 2

test: setup  ## every tier: unit, integration, e2e, robustness
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=25

test-unit: setup
	$(PY) -m pytest -q -m unit

bench: setup  ## storage and messaging benchmarks; figures are printed, never asserted
	$(PY) -m tools.bench.store_bench
	$(PY) -m tools.bench.messaging_bench
	$(PY) -m tools.bench.orderly_bench
	$(PY) -m tools.bench.filter_bench
	$(PY) -m tools.bench.timer_bench
	$(PY) -m tools.bench.transaction_bench
	$(PY) -m tools.bench.replication_bench
	$(PY) -m tools.bench.failover_bench
	$(PY) -m tools.bench.security_bench
	$(PY) -m tools.bench.telemetry_bench
	$(PY) -m tools.bench.spark_bench
	$(PY) -m tools.bench.pop_bench

# perf: RocketQ beside Redis / NATS / RabbitMQ (Debian packages, installed by peers.py when
# missing); never in CI. ARGS=--quick for short phases.
bench-peers: setup  ## RocketQ side by side with Redis Streams, NATS JetStream, RabbitMQ
	$(PY) -m tools.bench.peers $(ARGS)

dashboard: setup  ## regenerate deploy/grafana/rocketq.json and, from a live local run, docs/images/dashboard.png
	$(PY) -m tools.dashboard json
	$(PY) -m tools.dashboard render

gen-protos: setup  ## regenerate rocketq/_api from proto/
	$(PY) tools/gen_protos.py

verify-protos: setup  ## fail if rocketq/_api differs from what proto/ generates
	$(PY) tools/gen_protos.py --check

image: setup  ## build the container image $(IMAGE) with podman (base image from Debian packages, no registry)
	PY=$(PY) sh tools/build_image.sh $(IMAGE)

clean:
	rm -rf $(VENV) demo-store .rocketq-dev .pytest_cache .mypy_cache .ruff_cache .hypothesis .grimp_cache .import_linter_cache
