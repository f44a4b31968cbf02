# Two commands: `make demo` runs the whole pipeline, `make test` runs the tests (`make test-fast`: all but the slow ones).
# Both create .venv from the pinned requirements.lock when it is missing or stale.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PATH := $(abspath $(BIN)):$(PATH)
export PYSPARK_PYTHON := $(abspath $(BIN))/python
export PYSPARK_DRIVER_PYTHON := $(abspath $(BIN))/python

.PHONY: demo test test-fast lint typecheck format check-java venv bench-venv clean-data help es-test airflow chromium spark-cluster spark-server prototype-vectors

help:
	@echo "make demo   run the whole pipeline (crawl -> clean -> dedup -> tokenize -> train -> report) through Airflow"
	@echo "make test   lint and type-check, then run the test suite"
	@echo "make test-fast  lint, then the tests not marked slow (no Spark, Scrapy crawl, torchrun, Airflow, nvcc, servers)"
	@echo "make airflow  start Airflow here (UI on http://127.0.0.1:8080, login admin / printed password)"
	@echo "make spark-cluster  start a Spark standalone master + 2 workers on 127.0.0.1 to submit stages to"
	@echo "make spark-server  start a warm Spark Connect server on 127.0.0.1 for stages to attach to (SPARK_REMOTE)"
	@echo "make format apply ruff formatting"
	@echo "make bench-venv  create .venv-bench: the pinned environment plus the baselines benchmarks compare against"
	@echo "make es-test ELASTICSEARCH_URL=...  the log shipper tests against a real Elasticsearch cluster"
	@echo "make prototype-vectors  re-embed the bundled subject prototypes after changing pipeline/quality/subjects.yaml"
	@echo "make chromium  fetch the pinned headless Chromium into .chromium/ (the browser tests fetch it themselves too)"

venv: $(STAMP)

$(STAMP): requirements.lock setup.cfg pyproject.toml setup.py $(wildcard cuda_ext/csrc/*)
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is required, found " + sys.version.split()[0])'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.lock
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation --config-settings editable_mode=compat -e .
	@touch $(STAMP)

BENCH_STAMP := .venv-bench/.installed

bench-venv: $(BENCH_STAMP)

$(BENCH_STAMP): requirements.lock benchmarks/requirements.lock setup.cfg pyproject.toml
	@test -x .venv-bench/bin/python || $(PYTHON) -m venv .venv-bench
	.venv-bench/bin/python -m pip install --quiet --disable-pip-version-check -r requirements.lock -r benchmarks/requirements.lock
	.venv-bench/bin/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation --config-settings editable_mode=compat -e .
	@touch $(BENCH_STAMP)

# The pinned headless Chromium (npm's @sparticuz/chromium, integrity-checked) for the tests that open pages
# in a browser (tests/quality/test_report_browser.py).
chromium: $(STAMP)
	$(BIN)/python scripts/fetch_chromium.py

check-java:
	@$(PYTHON) scripts/check_java.py

demo: $(STAMP) check-java
	$(BIN)/python -m pipeline.demo

# One command for a local Airflow 3: api-server (UI + REST), scheduler, dag-processor and triggerer, all on
# 127.0.0.1 (no log servers), with SQLite in WAL mode and the LocalExecutor in .airflow/ (operators/local_airflow.py).
# The admin password is printed and kept in .airflow/simple_auth_manager_passwords.json.generated. Stop with Ctrl-C.
AIRFLOW_PORT ?= 8080
airflow: $(STAMP) check-java
	AIRFLOW_HOME=$(CURDIR)/.airflow \
	AIRFLOW__CORE__DAGS_FOLDER=$(CURDIR)/dags \
	AIRFLOW__CORE__LOAD_EXAMPLES=False \
	AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS=admin:admin \
	AIRFLOW__CORE__EXECUTOR=LocalExecutor \
	AIRFLOW__DATABASE__SQL_ALCHEMY_CONN="sqlite:///$(CURDIR)/.airflow/airflow.db?timeout=120" \
	AIRFLOW__API__HOST=127.0.0.1 \
	AIRFLOW__API__PORT=$(AIRFLOW_PORT) \
	AIRFLOW__API__BASE_URL=http://127.0.0.1:$(AIRFLOW_PORT) \
	AIRFLOW__CORE__EXECUTION_API_SERVER_URL=http://127.0.0.1:$(AIRFLOW_PORT)/execution/ \
	$(BIN)/python -m operators.local_airflow

# A Spark standalone cluster on this machine (pipeline/core/spark_cluster.py): a master and SPARK_WORKERS workers
# on 127.0.0.1 with free ports, SPARK_WORKER_CORES cores and SPARK_WORKER_MEMORY each, the one the cluster test
# (tests/core/test_spark_cluster.py) starts. It prints the master URL, the web UI and the pretrain_spark connection
# value; Ctrl-C stops it, workers, executors and all.
SPARK_WORKERS ?= 2
SPARK_WORKER_CORES ?= 1
SPARK_WORKER_MEMORY ?= 1g
spark-cluster: $(STAMP) check-java
	$(BIN)/python -m pipeline.core.spark_cluster --workers $(SPARK_WORKERS) --cores $(SPARK_WORKER_CORES) \
		--memory $(SPARK_WORKER_MEMORY)

# A warm Spark Connect server on 127.0.0.1:$(SPARK_CONNECT_PORT) (pipeline/core/spark_connect.py, the same as
# `pretrain spark-server`): Spark stages attach to it instead of starting a JVM each when SPARK_REMOTE (or the
# config's spark.remote) names the sc:// URL it prints. Ctrl-C stops it.
SPARK_CONNECT_PORT ?= 15002
SPARK_CONNECT_MASTER ?= local[2]
spark-server: $(STAMP) check-java
	$(BIN)/python -m pipeline.core.spark_connect --port $(SPARK_CONNECT_PORT) --set 'spark.master=$(SPARK_CONNECT_MASTER)'

# The bundled subject prototypes, embedded ahead of time by the bundled encoder (package data the quality
# report reads instead of embedding them on every run): rerun after editing pipeline/quality/subjects.yaml.
prototype-vectors: $(STAMP)
	$(BIN)/python -c 'from pipeline.quality.subjects import write_prototype_vectors; print(write_prototype_vectors())'

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# The type checker over pipeline/, operators/ and dags/ (its settings: [mypy] in setup.cfg).
typecheck: $(STAMP)
	$(BIN)/mypy

test: $(STAMP) check-java lint typecheck
	$(BIN)/python -m pytest

# The tests not marked slow (setup.cfg): nothing that starts Spark, a Scrapy crawl, torchrun, Airflow, nvcc or an
# MLflow/TensorBoard server, so no Java either. `make test` still runs everything.
test-fast: $(STAMP) lint
	$(BIN)/python -m pytest -m "not slow"

# The log shipper's protocol tests, run against a real cluster instead of the local stand-in.
# Credentials: ELASTICSEARCH_API_KEY, or ELASTICSEARCH_USERNAME and ELASTICSEARCH_PASSWORD.
es-test: $(STAMP)
	@test -n "$(ELASTICSEARCH_URL)" || { echo "es-test needs ELASTICSEARCH_URL=http(s)://host:9200" >&2; exit 2; }
	ELASTICSEARCH_URL="$(ELASTICSEARCH_URL)" $(BIN)/python -m pytest tests/logshipping/test_log_shipper.py

clean-data:
	rm -rf data .airflow
