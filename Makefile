# bertlab: from a fresh clone to a running dashboard.
#
#   make app     create .venv if needed, install, serve the dashboard (Voila) on PORT, with
#                BERTLAB_DATA (default ../shared/data, as for bench) for the training tabs
#   make test    install (skipped when up to date) and run the whole test suite
#   make bench   install, run every bench/bench_*.py (BENCH_ARGS=--quick for a short run), rewrite the docs' tables
#   make docs    build the documentation site into site/ (MkDocs, warnings as errors)
#   make lint    ruff over bertlab, tests and bench
#   make results re-measure the docs' fine-tuning table with today's defaults, then rewrite it
#                (hours on a CPU; ROWS="nli ner" for some rows, RESULTS_ARGS="--threads 1 --cpus 1")
#
# Variables: PYTHON (the interpreter that creates the venv), VENV (its folder), PORT, MODEL
# (a folder or Hugging Face name for `make app`), PYTEST_ARGS (e.g. -m "not slow"),
# PIP_ARGS (extra pip options, e.g. --extra-index-url https://download.pytorch.org/whl/cpu
# where no CPU build of torch is on your index), ALLOW_CUDA_TORCH=1 to skip the CPU check.

PYTHON ?= python3
VENV ?= .venv
PORT ?= 8866
MODEL ?=
PYTEST_ARGS ?=
PIP_ARGS ?=
BENCH_ARGS ?=
ROWS ?=
RESULTS_ARGS ?=
ALLOW_CUDA_TORCH ?= 0

BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.bertlab-installed
TOOLS_STAMP := $(VENV)/.bertlab-tools-installed
TORCH_SPEC := $(or $(shell sed -n 's/^[[:space:]]*"\(torch[=<>~!][^"]*\)".*/\1/p' pyproject.toml | head -n 1),torch)
BENCH_SCRIPTS := $(sort $(wildcard bench/bench_*.py))  # the fine-tuning table: make results

.PHONY: help install app test bench results docs lint check-torch clean

help:
	@sed -n 's/^#   //p' Makefile

# -- environment -------------------------------------------------------------------------
$(PY):
	$(PYTHON) -m venv $(VENV)

# Re-install only when pyproject.toml changed since the last install.
$(STAMP): pyproject.toml | $(PY)
	@$(MAKE) --no-print-directory check-torch
	$(PY) -m pip install $(PIP_ARGS) -e ".[test]"
	@touch $@

install: $(STAMP)

# The docs and lint extras (MkDocs + Material, ruff), on top of the test install.
$(TOOLS_STAMP): pyproject.toml | $(STAMP)
	$(PY) -m pip install $(PIP_ARGS) -e ".[test,docs,lint]"
	@touch $@

# An unpinned or CUDA torch is a multi-GB download: ask pip which build it would take first.
define TORCH_CHECK
import json, platform, sys
items = json.load(open(sys.argv[1]))["install"]
if not items:
    print("torch: an installed version already meets the requirement")
for item in items:
    version, url = item["metadata"]["version"], item["download_info"]["url"]
    if platform.system() == "Linux" and "+cpu" not in version:
        sys.exit(f"pip would install torch {version} from {url}: the CUDA build (several GB). "
                 "Give pip the CPU build, e.g. make PIP_ARGS='--extra-index-url "
                 "https://download.pytorch.org/whl/cpu', or ALLOW_CUDA_TORCH=1 if you want CUDA.")
    print(f"torch {version} ({url.rsplit('/', 1)[-1]}): CPU build")
endef
export TORCH_CHECK

check-torch: | $(PY)
ifeq ($(ALLOW_CUDA_TORCH),1)
	@echo "ALLOW_CUDA_TORCH=1: not checking which torch build pip takes"
else
	$(PY) -m pip install --dry-run --no-deps --quiet --report $(VENV)/torch-report.json $(PIP_ARGS) "$(TORCH_SPEC)"
	@$(PY) -c "$$TORCH_CHECK" $(VENV)/torch-report.json
endif

# -- what people run -----------------------------------------------------------------------
# The training tabs read their data sets from BERTLAB_DATA: ../shared/data unless it is set, as for bench.
app: $(STAMP)
	@data="$${BERTLAB_DATA:-$(abspath ../shared/data)}"; \
	[ -d "$$data" ] || echo "No data folder at $$data: the training tabs need one (make app BERTLAB_DATA=/path/to/data)."; \
	BERTLAB_DATA="$$data" $(BIN)/bertlab serve --port $(PORT) $(if $(MODEL),--model "$(MODEL)")

test: $(STAMP)
	$(BIN)/pytest $(PYTEST_ARGS)

bench: $(STAMP)
	@$(if $(BENCH_SCRIPTS),,echo "no bench/*.py scripts yet")
	@set -e; export BERTLAB_DATA="$${BERTLAB_DATA:-$(abspath ../shared/data)}"; \
	for script in $(BENCH_SCRIPTS); do echo "== $$script"; $(PY) $$script $(BENCH_ARGS); done; \
	$(PY) bench/render.py

results: $(STAMP)
	@export BERTLAB_DATA="$${BERTLAB_DATA:-$(abspath ../shared/data)}"; \
	$(PY) bench/finetune_table.py $(foreach row,$(ROWS),--only $(row)) $(RESULTS_ARGS)

docs: $(TOOLS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

lint: $(TOOLS_STAMP)
	$(BIN)/ruff check bertlab tests bench

clean:
	rm -rf .pytest_cache build dist site $(STAMP) $(TOOLS_STAMP) $(VENV)/torch-report.json
	find bertlab tests -name __pycache__ -type d -prune -exec rm -rf {} +
