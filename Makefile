# Talaria — every target creates and uses the virtual environment .venv in the project root.
# Hermes (hermes-agent, pinned) lives in its own environment, .venv-hermes: it pins its own dependency
# versions and never goes into .venv. `make demo` and `make test` create it when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HERMES_VERSION := 0.19.0
HERMES_VENV := .venv-hermes
HERMES_STAMP := $(HERMES_VENV)/.installed-$(HERMES_VERSION)
CHROMIUM ?= /usr/bin/chromium
APT := DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends
PG_BIN ?= /usr/lib/postgresql/15/bin

.DEFAULT_GOAL := help
.PHONY: help venv hermes browser postgres demo test lint chaos-smoke chaos bench runner-bundle clean

help: ## show this help
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP) ## create .venv and install Talaria with its development tools

# A failed Hermes install does not stop make: the demo then falls back to the Hermes fixture and says
# so, and tests/hermes fails with a message saying how to install Hermes.
$(HERMES_STAMP): constraints-hermes.txt
	@echo "installing hermes-agent==$(HERMES_VERSION) into $(HERMES_VENV) (its own environment)"
	@rm -rf $(HERMES_VENV) && $(PYTHON) -m venv $(HERMES_VENV) \
	  && $(HERMES_VENV)/bin/pip install --quiet -c constraints-hermes.txt hermes-agent==$(HERMES_VERSION) \
	  && touch $(HERMES_STAMP) \
	  || echo "warning: could not install hermes-agent==$(HERMES_VERSION) into $(HERMES_VENV)"

hermes: $(HERMES_STAMP) ## create .venv-hermes with the pinned hermes-agent

# apt_install(file that must exist, Debian package): install the package with apt-get when the file is missing and
# this user may (root, or sudo); else say so. Nothing else is installed system-wide.
define apt_install
	@if [ -e "$(1)" ]; then :; \
	elif [ "$$(id -u)" = 0 ]; then echo "installing Debian's $(2) (apt-get)"; \
	  $(APT) $(2) >/dev/null || { apt-get update -qq && $(APT) $(2) >/dev/null; } \
	  || echo "warning: could not install $(2)"; \
	elif command -v sudo >/dev/null; then echo "installing Debian's $(2) (sudo apt-get)"; \
	  sudo sh -c '$(APT) $(2) >/dev/null || { apt-get update -qq && $(APT) $(2) >/dev/null; }' \
	  || echo "warning: could not install $(2)"; \
	else echo "warning: $(2) is missing and this user cannot install it (apt-get install $(2))"; fi
endef

# The browser tests drive Debian's chromium through Playwright (never `playwright install`). Installing it needs
# root (or sudo); without it tests/browser fails saying how to install it.
browser: ## install Debian's chromium for the browser tests when it is missing (apt-get)
	$(call apt_install,$(CHROMIUM),chromium)

# The PostgreSQL tests start their own server from Debian's postgresql-15 (scale.md 2.6); installing it needs root
# (or sudo). Without it they skip saying why, unless TALARIA_REQUIRE_POSTGRES=1 (CI), which makes them fail.
postgres: ## install Debian's PostgreSQL 15 server for the PostgreSQL tests when it is missing (apt-get)
	$(call apt_install,$(PG_BIN)/postgres,postgresql-15)

demo: $(STAMP) $(HERMES_STAMP) ## run the product end to end on the embedded SQLite default (Ctrl-C stops the hub)
	$(BIN)/talaria demo

# A crashed worker ends the run (--max-worker-restart 0): xdist's loadfile scheduler can hang for ever when it
# replaces one (pytest-xdist#1323). A hung test fails after pyproject's pytest timeout.
test: $(STAMP) $(HERMES_STAMP) browser postgres ## run the whole test suite (tests/hermes runs real Hermes from .venv-hermes)
	$(BIN)/python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --max-worker-restart 0

lint: $(STAMP) ## ruff (lint + format check) and mypy --strict
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy

chaos-smoke: $(STAMP) $(HERMES_STAMP) postgres ## the chaos benchmark's short runs: SQLite, 2 PostgreSQL replicas, real Hermes (part of make test)
	$(BIN)/python bench/chaos.py --smoke
	$(BIN)/python bench/chaos.py --smoke --postgres
	$(BIN)/python bench/chaos.py --smoke --real-hermes

chaos: $(STAMP) ## the chaos benchmark's default run (docs/reliability.md; --quick for a shorter one)
	$(BIN)/python bench/chaos.py

bench: $(STAMP) ## lifecycle benchmark (prints figures; JSON object on the last line)
	$(BIN)/python bench/lifecycle_bench.py

# The single-file runner (operations.md 1.1): its wheels are fetched once into build/wheels (pip download).
runner-bundle: $(STAMP) ## build dist/talaria-runner.pyz and its .sha256 (pure Python, reproducible)
	$(BIN)/python -m talaria.bundle

clean: ## remove the virtual environment and caches
	rm -rf $(VENV) $(HERMES_VENV) .mypy_cache .ruff_cache .pytest_cache
