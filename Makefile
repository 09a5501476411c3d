# Two commands do everything on a fresh machine:
#   make demo   - emulator + relay + a local webhook consumer, signed events printed as they arrive
#   make test   - lint, type check and the whole test suite (make quick: its fast tiers)
# Both create .venv and install what they run first: the demo the package and its
# dependencies, the tests those and their tools (the test extras), at the versions of the
# locks in requirements/ (scripts/install; `make lock` refreshes them: docs/operations.md).
PYTHON  ?= python3
export PYTHON
VENV    := .venv
BIN     := $(VENV)/bin
LOCKS   := requirements
# What the demo runs: the package and its dependencies.
RUNTIME := $(VENV)/.runtime
# That and the test extras (pytest, ruff, mypy, selenium...): lint, test, bench.
STAMP   := $(VENV)/.installed
# The official Jules SDK under Node (make jules-sdk).
JULES_SDK := .cache/jules-sdk/node_modules/@google/jules-sdk/dist/index.mjs

.PHONY: demo test quick lint typecheck bench clean system-deps lock jules-sdk

# No pip in it: scripts/install brings uv with the interpreter's own pip, then the locks.
$(BIN)/python:
	$(PYTHON) -m venv --without-pip $(VENV)

$(RUNTIME): pyproject.toml $(LOCKS)/runtime.txt | $(BIN)/python
	scripts/install $(VENV) $(LOCKS)/runtime.txt
	touch $(RUNTIME)

$(STAMP): $(RUNTIME) $(LOCKS)/test.txt
	scripts/install $(VENV) $(LOCKS)/test.txt
	touch $(STAMP)

# The locks from pyproject.toml, for every platform: versions already locked are kept
# while they fit; `make lock UPGRADE=--upgrade` takes the newest that fit (or
# UPGRADE='--upgrade-package NAME'). The runtime's lock is a subset of the tests'.
COMPILE = $(BIN)/uv pip compile --quiet --universal --generate-hashes \
	--custom-compile-command 'make lock' $(UPGRADE)
lock: $(RUNTIME)
	$(COMPILE) pyproject.toml --extra test -o $(LOCKS)/test.txt
	$(COMPILE) pyproject.toml -c $(LOCKS)/test.txt -o $(LOCKS)/runtime.txt
	echo uv | $(COMPILE) - -o $(LOCKS)/uv.txt

demo: $(RUNTIME)
	$(BIN)/sessionhook demo

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

# Real PostgreSQL and Chromium for the tests that use them (apt-get on a fresh Debian machine).
system-deps:
	@scripts/system-deps

# The suite on $(1) workers, then $(2)'s options (docs/testing.md). pytest exits 5 when it
# selected no tests: that is a broken suite, not a pass. Bytecode is written even where
# PYTHONDONTWRITEBYTECODE is set: else every run re-parses each test module to rewrite its
# asserts (~10 s a worker) and each `sessionhook` a test starts compiles what it imports.
PYTEST = PYTHONDONTWRITEBYTECODE= $(BIN)/pytest -n $(1) $(2); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "error: pytest selected no tests" >&2; exit 1; fi; \
	exit $$rc

# Four workers on two cores: most process-tier tests wait on sockets and timers, so the
# whole suite takes about 380 s on four against 470 s on two (docs/testing.md).
test: lint system-deps $(JULES_SDK)
	@$(call PYTEST,4)

# The unit and app tiers: the loop to run while working (under a minute); no lint. Four
# workers, as for make test: many app tests wait on sockets and timers (about 50 s on four
# against 70 s on two, docs/testing.md).
quick: $(STAMP)
	@$(call PYTEST,4,-m "not process")

# The official Jules SDK (Node, its lock in tests/jules-sdk) for the test that drives it
# against the emulator. Without npm or the registry the test is skipped, except under
# CI=true, where this fails.
jules-sdk: $(JULES_SDK)
$(JULES_SDK): tests/jules-sdk/package.json tests/jules-sdk/package-lock.json
	@mkdir -p .cache/jules-sdk && cp tests/jules-sdk/package*.json .cache/jules-sdk/
	@npm ci --prefix .cache/jules-sdk --no-audit --no-fund --loglevel=error >/dev/null \
		&& touch $@ || { echo "jules-sdk: npm ci failed: its test will be skipped" >&2; \
		[ "$${CI:-}" != true ]; }

bench: $(STAMP)
	$(BIN)/python bench/latency.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .cache
