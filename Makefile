# The two commands a new machine needs: `make demo` and `make test`.
# Each creates .venv if missing, installs sparkbeam with pinned dependencies,
# checks for Java 17+, then runs.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: demo test test-fast lint bench java-check install clean

$(STAMP): pyproject.toml constraints.txt setup.py
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[test,dev,rocksdb]'
	@touch $(STAMP)

install: $(STAMP)

java-check:
	@$(PYTHON) scripts/check_java.py

demo: $(STAMP) java-check
	@rm -f out/wordcount-*
	$(PY) examples/wordcount.py --runner=SparkCheckpointRunner --output out/wordcount
	@echo "--- the 15 most frequent words (out/wordcount-*):"
	@cat out/wordcount-* | sort -t: -k2 -nr | head -15

test: $(STAMP) java-check
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: $(STAMP) java-check
	$(PY) -m pytest -m "not slow and not cluster" $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check runner sdf translation checkpoint sparkbeam tests examples benchmarks
	$(VENV)/bin/ruff format --check runner sdf translation checkpoint sparkbeam
	$(VENV)/bin/mypy runner sdf translation checkpoint

bench: $(STAMP) java-check
	$(PY) benchmarks/wordcount.py --size 20
	$(PY) benchmarks/checkpoint_store.py --keys 1e4,1e5
	$(PY) benchmarks/sdf.py

clean:
	rm -rf $(VENV) build *.egg-info out
