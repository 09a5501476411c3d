# Two commands do everything on a fresh machine:
#   make demo   - emulator + relay + a local webhook consumer, signed events printed as they arrive
#   make test   - lint, type check and the whole test suite
# Both create .venv and install what they run first: the demo the package and its
# dependencies, the tests those and their tools (the test extras).
PYTHON  ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
# What the demo runs: the package and its dependencies.
RUNTIME := $(VENV)/.runtime
# That and the test extras (pytest, ruff, mypy, selenium...): lint, test, bench.
STAMP   := $(VENV)/.installed

.PHONY: demo test lint typecheck bench clean system-deps

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(RUNTIME): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $(RUNTIME)

$(STAMP): $(RUNTIME)
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(RUNTIME)
	$(BIN)/sessionhook demo

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

# Real PostgreSQL and Chromium for the tests that use them (apt-get on a fresh Debian machine).
system-deps:
	@scripts/system-deps

# pytest exits 5 when it selected no tests: that is a broken suite, not a pass.
test: lint system-deps
	@$(BIN)/pytest -n 2; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "error: pytest selected no tests" >&2; exit 1; fi; \
	exit $$rc

bench: $(STAMP)
	$(BIN)/python bench/latency.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
