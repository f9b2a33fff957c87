# Two entry points for people (see README): `make demo` and `make test`.
# Both create the virtualenv .venv and install jobreg into it first, every dependency at the
# version requirements.lock pins (`make lock` writes it from pyproject.toml's ranges).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
LOCK   := requirements.lock
UV     := uv==0.13.9

.PHONY: demo test lint bench clean system peers lock

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

# The lock first (exact versions, nothing resolved here), then jobreg itself without
# dependencies: the lock holds every one of them (tests/unit/test_install.py checks).
$(BIN)/.installed: pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r $(LOCK)
	$(BIN)/python -m pip install --quiet --no-deps -e '.[test]'
	touch $@

# Resolve pyproject.toml's ranges (the base install and the `test` extra, which takes in
# every other extra but `peers`) for Python 3.11 into $(LOCK). Versions the lock already
# pins stay unless the ranges exclude them; `make lock ARGS=--upgrade` takes the newest.
# uv runs from its own virtualenv, so a stale .venv does not matter here.
lock:
	@[ -x $(VENV)-lock/bin/uv ] || { $(PYTHON) -m venv $(VENV)-lock && \
	  $(VENV)-lock/bin/python -m pip install --quiet '$(UV)'; }
	$(VENV)-lock/bin/uv pip compile --quiet --python-version 3.11 --extra test \
	  --custom-compile-command 'make lock' $(ARGS) -o $(LOCK) pyproject.toml

demo: $(BIN)/.installed
	$(BIN)/jobreg demo

# `make test` runs in parts, each timed: the checks, the Flink backend's Maven build with
# Flink's contract tests against it (flink-jobreg/; its jar is what the Flink failover tests put
# on JobManager classpaths, so it is built before pytest; Maven's repository stays in ~/.m2),
# the whole suite on the embedded broker
# (with the tests of Apache Kafka itself, marker `kafka`, which start their own nodes) and,
# beside it in a second process, the integration suite again on one Apache Kafka node
# (JOBREG_TEST_BROKER=kafka; tests marked embedded_only are skipped there, each with its
# reason; its output is printed when the embedded pass ends). The two passes share no broker,
# database or port (every fixture takes free loopback ports) and spend much of their time
# waiting on leases, brokers and JVMs: side by side on 2 cores both took about 39 min against
# 51 min one after the other (the embedded pass about 20 % slower while the other runs).
# The jars both passes need are fetched first (tests/support/fetch.py), so that they never
# fetch into the cache at once: Kafka's jars and Spark's Kafka connector from Maven
# Central into ~/.cache/jobreg (registry/dev/kafka.py), Flink's through Maven's repository
# (registry/dev/flink.py); on CI a connector that cannot be had stops the run here.
TIMED = $(PYTHON) -c 'import subprocess, sys, time; t = time.monotonic(); rc = subprocess.call(sys.argv[2:]); print(f"== {sys.argv[1]}: {time.monotonic() - t:.0f} s, exit {rc}", flush=True); sys.exit(rc)'

test: $(BIN)/.installed system
	@$(TIMED) "ruff" $(BIN)/ruff check registry consumers tests
	@$(TIMED) "import contracts" $(BIN)/lint-imports
	@$(TIMED) "mypy" $(BIN)/mypy
	@$(TIMED) "schema catalog" $(BIN)/jobreg catalog --check
	@$(TIMED) "maven, flink-jobreg" mvn -B -q -f flink-jobreg/pom.xml verify -Djobreg.python=$(abspath $(BIN))/python
	@$(TIMED) "jars" $(BIN)/python -m tests.support.fetch
	@log=$$(mktemp); ( JOBREG_TEST_BROKER=kafka $(TIMED) "pytest, Apache Kafka" $(BIN)/pytest -q \
	    -m "not kafka" tests/integration; kafka=$$?; \
	    $(TIMED) "pytest, unit" $(BIN)/pytest -q --durations=10 tests/unit; unit=$$?; \
	    [ $$kafka = 0 ] && [ $$unit = 0 ] ) > "$$log" 2>&1 & beside=$$!; \
	  $(TIMED) "pytest, embedded broker" $(BIN)/pytest -q --durations=25 tests/integration \
	    tests/fuzz; embedded=$$?; \
	  wait $$beside; rc=$$?; echo "== the Apache Kafka pass, then the unit tests, which ran beside it:"; \
	  cat "$$log"; rm -f "$$log"; [ $$embedded = 0 ] && [ $$rc = 0 ]

bench: $(BIN)/.installed
	$(BIN)/jobreg bench core

# jobreg next to etcd and ZooKeeper (`jobreg bench peers`): Debian's etcd-server and zookeeper,
# installed when missing and we may (root with apt-get), and the peers' Python clients.
# Not part of `make test`.
peers: $(BIN)/.installed
	@for pkg in etcd-server:/usr/bin/etcd zookeeper:/usr/share/java/zookeeper.jar; do \
	  name=$${pkg%%:*}; file=$${pkg#*:}; \
	  [ -e "$$file" ] && continue; \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing $$name (apt-get)"; \
	    apt-get install -y -q $$name >/dev/null 2>&1 || \
	      { apt-get update -q >/dev/null && apt-get install -y -q $$name >/dev/null; }; \
	  else \
	    echo "warning: $$name is missing; bench peers skips it (apt-get install $$name)"; \
	  fi; done
	@$(BIN)/python -c 'import kazoo, aetcd' 2>/dev/null || \
	  $(BIN)/python -m pip install --quiet -c $(LOCK) -e '.[peers]'
	$(BIN)/jobreg bench peers

clean:
	rm -rf $(VENV) $(VENV)-lock .pytest_cache .hypothesis .ruff_cache *.egg-info
