# Two entry points for people (see README): `make demo` and `make test`.
# Both create the virtualenv .venv and install jobreg into it first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: demo test lint bench clean system

# System packages the tests use: Debian's chromium (the incident report opens in it).
# Installed when missing and we may (root with apt-get, as on CI); else a warning.
system:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing chromium (apt-get)"; \
	    apt-get install -y -q chromium >/dev/null 2>&1 || \
	      { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }; \
	  else \
	    echo "warning: chromium is missing; the report test fails (apt-get install chromium)"; \
	  fi; }

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

demo: $(BIN)/.installed
	$(BIN)/jobreg demo

test: $(BIN)/.installed system
	$(BIN)/ruff check registry consumers tests
	$(BIN)/jobreg catalog --check
	$(BIN)/pytest -q

bench: $(BIN)/.installed
	$(BIN)/jobreg bench core

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .ruff_cache *.egg-info
