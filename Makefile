# The two commands a new user runs first: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: demo test test-external venv docs typecheck clean

venv: $(VENV)/.installed

$(VENV)/.installed: setup.cfg setup.py pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

demo: venv
	$(BIN)/runledger-sync demo

test: venv
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# mypy over runledger_sync/ (settings in pyproject.toml).
typecheck: venv
	$(BIN)/mypy

# The documentation site, into site/: strict, so a broken link or reference fails the build.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) build dist site *.egg-info
