# The two commands a new user runs first: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=
# What the whole suite and its quick part take on a quiet 2-core machine, said before they start.
TEST_LENGTH := about 15 minutes on 2 cores
QUICK_LENGTH := a few minutes

.PHONY: demo test test-quick venv docs docs-serve typecheck clean

# One virtualenv, two installs: the demo needs only the library and the embedded server,
# the tests and tools need .[dev]. Each has its own stamp, so either may come first.
venv: $(VENV)/.installed-dev

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed-demo: setup.cfg setup.py pyproject.toml | $(VENV)/bin/python
	$(BIN)/pip install --quiet -e '.[embedded]'
	touch $@

$(VENV)/.installed-dev: setup.cfg setup.py pyproject.toml | $(VENV)/bin/python
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

demo: $(VENV)/.installed-demo
	$(BIN)/runledger-sync demo

test: venv
	@echo "make test: the whole suite takes $(TEST_LENGTH); make test-quick is the inner loop ($(QUICK_LENGTH))"
	$(BIN)/python -m pytest -n 2 $(PYTEST_ARGS)

# The inner loop: the tests without a database and the SQL layer's, on two processes.
test-quick: venv
	@echo "make test-quick: the unit and SQL-layer tests take $(QUICK_LENGTH)"
	$(BIN)/python -m pytest -n 2 tests/unit tests/db/store $(PYTEST_ARGS)

# mypy over runledger_sync/ (settings in pyproject.toml).
typecheck: venv
	$(BIN)/mypy

# The documentation site, into site/: strict, so a broken link or reference fails the build.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The site with working search and links, rebuilt on every edit: http://127.0.0.1:8000/
docs-serve: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --dev-addr 127.0.0.1:8000

clean:
	rm -rf $(VENV) build dist site *.egg-info
