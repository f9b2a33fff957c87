# Two entry points for people (see README): `make demo` and `make test`.
# Both create the virtualenv .venv and install jobreg into it first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: demo test lint bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

demo: $(BIN)/.installed
	$(BIN)/jobreg demo

test: $(BIN)/.installed
	$(BIN)/ruff check registry consumers tests
	$(BIN)/jobreg catalog --check
	$(BIN)/pytest -q

bench: $(BIN)/.installed
	$(BIN)/jobreg bench core

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .ruff_cache *.egg-info
