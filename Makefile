# Two entry points for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Three workers (pytest-xdist) on two cores: the suite waits on subprocesses, servers and
# JVMs a good part of its time (measured: 2,288 CPU-seconds of work, the servers and JVMs it
# starts included, in a 1,585 s pass on two workers: 28% of both cores idle), which a third
# worker fills. Slow tests are collected first (tests/conftest.py)
# and handed out one at a time to whichever worker is free (--dist loadgroup, in collection
# order: --no-loadscope-reorder), so the minutes-long ones are shared between the workers
# instead of queued on one; but the tests of a module that starts a cluster, a Spark Connect
# server or an Airflow home go to one worker together, which starts it once
# (tests/conftest.py: ONE_WORKER).
# `make test PYTEST_ARGS=` runs it in one process.
PYTEST_ARGS ?= -n 3 --dist loadgroup --no-loadscope-reorder

.PHONY: demo test lint bytecode azurite typecheck pytest pytest-spark35 spark35-env airflow-env redis-server postgresql npm bench clean constraints dist

# uv installs the project and its pins (pip is only used to install uv itself): on a fresh
# machine it fetches and unpacks in parallel, a couple of minutes faster than pip.
# Bytecode compiled at install: uv leaves it to first import otherwise, and where
# PYTHONDONTWRITEBYTECODE is set every process (each Spark driver and Python worker the
# tests start) would compile pyspark and the rest again.
# No cache: pyspark comes only as source, and uv's cache kept a new copy of its unpacked
# source and built wheel (about 2 GB) for every fresh checkout's install, which filled the
# disk of a machine making checkouts often. Every install downloads afresh instead.
UV := $(BIN)/uv pip install --quiet --no-cache --compile-bytecode --python $(BIN)/python \
	-c constraints.txt

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt uv

$(STAMP): $(BIN)/python setup.cfg pyproject.toml constraints.txt
	$(UV) -e '.[test]'
	touch $(STAMP)

# Re-pin after upgrading dependencies on purpose (then run make test).
constraints: $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade -e '.[test,bench]'
	{ sed -n '1,2p' constraints.txt; $(BIN)/pip freeze --exclude-editable; } > constraints.tmp
	mv constraints.tmp constraints.txt

# redis-server 7 comes from Debian's package: PyPI has no usable build for Python 3.11.
redis-server:
	@command -v redis-server >/dev/null 2>&1 || { \
	  echo "installing redis-server from Debian's package"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }

# PostgreSQL's server binaries (initdb, postgres) come from Debian's package, for the
# throwaway clusters of the tests (tests/postgres_helpers.py); after redis-server, so that
# two apt-get runs never wait on each other's lock. make test's first stage makes it as
# npm's prerequisite.
postgresql: redis-server
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
	  echo "installing postgresql from Debian's package"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; }

# npm installs Azurite, the Azure Blob emulator of the tests, on first use (tests/azure_helpers.py);
# after postgresql, so that two apt-get runs never wait on each other's lock.
npm: postgresql
	@command -v npm >/dev/null 2>&1 || { \
	  echo "installing npm from Debian's package"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm >/dev/null; }

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

# The classes a Spark driver loads, archived once per venv for the suite's JVMs (tests/jvm.py).
SPARK_ARCHIVE := $(VENV)/spark-classes.jsa

$(SPARK_ARCHIVE): $(STAMP) tests/jvm.py
	$(BIN)/python tests/jvm.py

# Spark's Python workers import pyspark from site-packages, compiled, not from Spark's zip of
# its sources (tests/worker_path.py): a .pth file in the venv, written once.
SPARK_WORKERS := $(VENV)/.spark-workers

$(SPARK_WORKERS): $(STAMP) tests/worker_path.py tests/spark_daemon.py
	$(BIN)/python tests/worker_path.py
	touch $(SPARK_WORKERS)

# The checkout's own modules compiled once, as its dependencies are at install: where
# PYTHONDONTWRITEBYTECODE is set, every process the tests start (each commitpub command,
# Batch script, Spark worker daemon and pytest worker) would compile them again: measured, a
# quarter of the CPU of the tests that run commitpub commands. Then pytest's rewrite of the
# test modules' asserts, written to its own cache files as a collection does where Python
# may write bytecode, which each pytest worker of both passes reads instead of rewriting.
# Both only do what a change since the last time left to do.
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q -j 0 commitpub commitsteps jobs publisher store tests examples >/dev/null
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest --collect-only -q -p no:cacheprovider \
	  > $(VENV)/collected.txt || { cat $(VENV)/collected.txt; exit 1; }

pytest: $(STAMP) redis-server postgresql npm $(SPARK_ARCHIVE) $(SPARK_WORKERS) bytecode
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The Spark-dependent core again on pyspark 3.5, in a second virtual environment made once
# under ~/.cache/commitpub and reused (tests/spark35.py says which tests and why).
pytest-spark35: $(STAMP) redis-server bytecode
	$(BIN)/python tests/spark35.py $(PYTEST_ARGS)

# Only the pyspark 3.5 environment: made beside lint and type checks, its download and
# unpacking fill the time they leave a core waiting.
spark35-env: $(STAMP)
	$(BIN)/python tests/spark35.py --prepare

# Only Azurite's install from npm (tests/azure_helpers.py), made beside lint and type checks
# too instead of by the first test that needs it.
azurite: npm $(STAMP)
	$(BIN)/python tests/azure_helpers.py

# Only Airflow's environment (tests/airflow_env.py), made beside lint and type checks too.
airflow-env: $(STAMP)
	$(BIN)/python tests/airflow_env.py --prepare

# Lint, type checks, redis-server, the Spark class archive, the checkout's bytecode, Azurite
# and the pyspark 3.5 and Airflow environments are independent: made side by side (the
# archive's JVM and mypy each keep a core busy, the environments and Azurite mostly wait on
# the network), then the tests, then pyspark 3.5.
# One pass at a time: the main pass keeps both cores busy (measured: 3,671 CPU-seconds in a
# 35-minute pass), and the pyspark 3.5 pass run beside it took 25 minutes instead of 4 and
# slowed the main pass by more than that (51.6 minutes in all against 37 one after the other).
# The whole run's time is printed at its end, pass or fail (pytest lists the slowest tests).
test:
	@start=$$(date +%s); status=0; \
	$(MAKE) --no-print-directory -j 8 lint typecheck redis-server npm $(SPARK_ARCHIVE) $(SPARK_WORKERS) bytecode spark35-env airflow-env azurite \
	  && $(MAKE) --no-print-directory pytest \
	  && $(MAKE) --no-print-directory pytest-spark35 || status=$$?; \
	elapsed=$$(( $$(date +%s) - start )); \
	echo "make test: $$((elapsed / 60)) min $$((elapsed % 60)) s, exit $$status"; exit $$status

demo: $(STAMP)
	$(BIN)/commitpub demo --dir demo

# A wheel to install into your own project's environment, extras and all:
# pip install 'dist/commitpub-0.1.0-py3-none-any.whl[spark,redis]'.
dist: $(BIN)/python
	$(BIN)/uv build --quiet --wheel --out-dir dist .
	rm -rf build
	@ls dist/*.whl

# Every benchmarks/NAME.py (helpers start with an underscore), then report.py refreshes the
# README table and chart. Fixtures shared between scripts live in BENCH_CACHE, removed after.
# `make bench BENCH_ARGS=--quick` is a smoke run at small N; it leaves the README's figures.
BENCH_CACHE ?= $(CURDIR)/.bench-cache
BENCH_ARGS ?=
BENCH_STAMP := $(VENV)/.installed-bench

$(BENCH_STAMP): $(STAMP)
	$(UV) -e '.[test,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP) redis-server postgresql
	@for f in benchmarks/[!_]*.py; do \
	  [ "$$f" = benchmarks/report.py ] && continue; \
	  echo "== $$f"; BENCH_CACHE=$(BENCH_CACHE) $(BIN)/python $$f $(BENCH_ARGS) || exit 1; done
	rm -rf $(BENCH_CACHE)
	$(BIN)/python benchmarks/report.py

clean:
	rm -rf $(VENV) demo dist build .bench-cache .mypy_cache .ruff_cache .pytest_cache .hypothesis *.egg-info
