# Two entry points for a fresh machine (Python 3.11 + package registries):
#   make smoke   set up, then run the smoke study through DVC -> reports/smoke/index.html
#   make test    set up, then run the test suite (slow integration tests included)
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export DVC_NO_ANALYTICS := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup lint smoke test test-fast bench bench-dvc clean-results exps

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

# The smoke study's stage: only the smoke study runs (and its data and code stamps), whatever else params.yaml selects.
smoke: $(STAMP)
	@grep -q '^  study-smoke:' dvc.yaml || { echo "the smoke study is not selected: run 'study select smoke' (params.yaml)"; exit 2; }
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/dvc repro study-smoke
	@echo "report: reports/smoke/index.html"

# `dvc exp show` without the dependency-hash columns (code folders, stamps, specs): the selection and metrics
exps: $(STAMP)
	$(BIN)/dvc exp show --no-pager --drop '^(study|pipeline|ablations)/'

# ruff first: a lint or format error fails CI before the long suite starts
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: $(STAMP) lint
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m pytest -q -ra --durations=25

test-fast: $(STAMP)
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m pytest -q -ra -m "not slow"

bench: $(STAMP)
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python -m bench.data
	$(BIN)/python -m bench.instances
	$(BIN)/python -m bench.throughput
	$(BIN)/python -m bench.mlm_loss
	$(BIN)/python -m bench.search
	$(BIN)/python -m bench.contention

# DVC's no-op cost (`dvc status`, `dvc repro`) with 1, 10 and 50 selected studies of 20 runs, and
# `dvc repro --dry` in a fresh clone with every shipped study and profile selected (docs/RESULTS.md)
bench-dvc: $(STAMP)
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m bench.dvc_scale
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m bench.dvc_scale --shipped
