# Talaria — every target creates and uses the virtual environment .venv in the project root.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help venv demo test lint bench clean

help: ## show this help
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-8s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP) ## create .venv and install Talaria with its development tools

demo: $(STAMP) ## run the product end to end on the embedded SQLite default (Ctrl-C stops the hub)
	$(BIN)/talaria demo

test: $(STAMP) ## run the whole test suite
	$(BIN)/python -m pytest -q -p no:cacheprovider

lint: $(STAMP) ## ruff (lint + format check) and mypy --strict
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy

bench: $(STAMP) ## lifecycle benchmark (prints figures; JSON object on the last line)
	$(BIN)/python bench/lifecycle_bench.py

clean: ## remove the virtual environment and caches
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
