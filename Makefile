# The two commands a new machine needs: `make demo` and `make test`.
# Each creates .venv if missing, installs sparkbeam with pinned dependencies,
# checks for Java 17+, then runs.

PYTHON ?= python3
# Python's default: keep the bytecode of our sources and pytest's rewritten test modules. With
# PYTHONDONTWRITEBYTECODE set (as on some CI machines) every test process compiled sparkbeam
# again (importing the runner 3.2 -> 2.5 CPU-s) and every pytest worker rewrote the whole
# suite at collection (13.7 -> 7.3 CPU-s).
unexport PYTHONDONTWRITEBYTECODE
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=
# Three pytest workers (each with its own Spark session), on 2 cores too: many tests wait on a
# driver subprocess or a resume delay, and with two workers the cores were idle about a third
# of the suite (fresh clone here: 34.3 min whole with two, 28.2 with three). Four are slower
# (35.5 min against 34.0 with three on one machine, session 52: vmstat showed the cores 0% idle
# throughout). The cluster tests share one standalone cluster, hence one worker; the Connect
# tests one server.
XDIST ?= -n 3 --dist loadgroup

# Azurite, the Azure Blob Storage emulator of the tests, from npm (tests/azurite pins it and every
# package it needs). Without npm its tests skip, saying so; the GCS emulator is a test extra.
AZURITE       := $(VENV)/azurite
AZURITE_STAMP := $(AZURITE)/.installed

# The newest pyspark sparkbeam supports (pyproject.toml: pyspark>=4.0,<4.4). `make test` runs the
# whole suite on the pinned one (constraints.txt) and SMOKE_TESTS on this one, in .venv-newest:
# it holds pyspark (and the py4j pip picks to match it) and sees every other package in .venv,
# pinned by the same constraints (scripts/layer_venv.py).
NEWEST_SPARK ?= 4.3.0
NEWEST_VENV  := .venv-newest
NEWEST_PY    := $(NEWEST_VENV)/bin/python
NEWEST_STAMP := $(NEWEST_VENV)/.installed-pyspark-$(NEWEST_SPARK)
SMOKE_TESTS  := \
  tests/runner/test_wordcount_subprocess.py::test_wordcount_matches_direct_runner \
  'tests/sdf/test_runner_splits.py::test_split_residuals_are_processed_in_a_later_round_and_nothing_is_lost[checkpoint-dir]' \
  tests/streaming/test_recovery.py::test_killed_driver_resumes_with_no_loss_and_no_duplicates

.PHONY: demo test test-fast test-newest-spark lint bench java-check install clean

# uv installs what pip would, from the same pins, faster (pip: 146 s from an empty cache here),
# and compiles the bytecode as pip does: without it no process found Beam's .pyc files (the
# tests write none) and each compiled Beam at import (8.2 s against 3.8 s). pip installs it
# where uv cannot (no uv wheel, no network for its own TLS roots).
UV := $(VENV)/bin/uv
PROJECT := -c constraints.txt -e '.[test,dev,rocksdb]'
PIP_INSTALL = $(UV) pip install -q --compile-bytecode --python $(1) $(2) || $(1) -m pip install -q $(2)

$(STAMP): pyproject.toml constraints.txt setup.py
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q -c constraints.txt uv || echo "uv not installed: pip installs the packages"
	$(call PIP_INSTALL,$(PY),$(PROJECT))
	@touch $(STAMP)

install: $(STAMP) $(AZURITE_STAMP)

$(AZURITE_STAMP): tests/azurite/package.json tests/azurite/package-lock.json | $(STAMP)
	@if command -v npm >/dev/null 2>&1; then \
	  mkdir -p $(AZURITE) && cp tests/azurite/package.json tests/azurite/package-lock.json $(AZURITE)/ && \
	  npm ci --prefix $(AZURITE) --no-audit --no-fund --loglevel=error && touch $@; \
	else echo "npm not found: the Azure Blob Storage tests will skip (they need Azurite, from npm)"; fi

$(NEWEST_STAMP): $(STAMP) scripts/layer_venv.py
	@test -x $(NEWEST_PY) || $(PYTHON) -m venv $(NEWEST_VENV)
	$(NEWEST_PY) scripts/layer_venv.py "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
	$(call PIP_INSTALL,$(NEWEST_PY),pyspark==$(NEWEST_SPARK))
	@rm -f $(NEWEST_VENV)/.installed-pyspark-*
	@touch $@

java-check:
	@$(PYTHON) scripts/check_java.py

demo: $(STAMP) java-check
	@rm -f out/wordcount-*
	$(PY) examples/wordcount.py --runner=SparkCheckpointRunner --output out/wordcount
	@echo "--- the 15 most frequent words (out/wordcount-*):"
	@cat out/wordcount-* | sort -t: -k2 -nr | head -15

# The newest-pyspark venv (a download and a copy of jars: little CPU) is made while the suite
# runs, and its smoke subset runs there too, in one process, once the venv is ready: run after
# the suite it added its minute to every run, while the suite's last minutes leave cores idle.
test: $(STAMP) $(AZURITE_STAMP) java-check
	@rm -f $(VENV)/newest-spark-tests.log; \
	{ $(MAKE) --no-print-directory $(NEWEST_STAMP) > $(VENV)/newest-spark-install.log 2>&1 && \
	  $(MAKE) --no-print-directory test-newest-spark XDIST= > $(VENV)/newest-spark-tests.log 2>&1; } & \
	newest=$$!; \
	$(PY) -m pytest $(XDIST) $(PYTEST_ARGS); status=$$?; \
	wait $$newest; newest_status=$$?; \
	test -f $(NEWEST_STAMP) || cat $(VENV)/newest-spark-install.log; \
	cat $(VENV)/newest-spark-tests.log 2>/dev/null | tail -n $$([ $$newest_status -ne 0 ] && echo 200 || echo 1); \
	test $$status -eq 0 || exit $$status; \
	exit $$newest_status

# Smoke subset on the newest supported pyspark: a batch driver of its own, an SDF's residuals
# through the store in rounds (in process: the killed-SDF test cost 100 s there), a streaming
# driver killed and resumed.
test-newest-spark: $(NEWEST_STAMP) java-check
	SPARKBEAM_TEST_JVM_ARCHIVE=0 $(NEWEST_PY) -m pytest $(XDIST) $(SMOKE_TESTS)

test-fast: $(STAMP) $(AZURITE_STAMP) java-check
	$(PY) -m pytest -m "not slow and not cluster" $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check runner sdf translation checkpoint sparkbeam tests examples benchmarks
	$(VENV)/bin/ruff format --check runner sdf translation checkpoint sparkbeam
	$(VENV)/bin/mypy runner sdf translation checkpoint sparkbeam/io

# The Python stream processors benchmarks/kafka.py compares with (Quix Streams, bytewax), in a
# venv of their own: their pins clash with constraints.txt. Not part of `make test`.
PEERS_VENV  := .venv-peers
PEERS_STAMP := $(PEERS_VENV)/.installed

$(PEERS_STAMP): benchmarks/peers-requirements.txt
	@test -x $(PEERS_VENV)/bin/python || $(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install -q -r benchmarks/peers-requirements.txt
	@touch $@

bench: $(STAMP) $(PEERS_STAMP) java-check
	$(PY) benchmarks/wordcount.py --size 20
	$(PY) benchmarks/checkpoint_store.py --keys 1e4,1e5
	$(PY) benchmarks/sdf.py
	$(PY) benchmarks/kafka.py --throughput-only

clean:
	rm -rf $(VENV) $(NEWEST_VENV) $(PEERS_VENV) build *.egg-info out
