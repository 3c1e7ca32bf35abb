# ncclwatch: `make demo` shows the product, `make test` proves it.
# Both create .venv and install everything they need on a fresh machine.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
TORCH  := torch==2.13.0
PROTOS := $(wildcard proto/ncclwatch/v1/*.proto)

.PHONY: all venv system-deps proto runbooks test test-fast scenarios demo bench clean

all: test

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH)" -e '.[test,workload]'
	touch $@

venv: $(STAMP)

# Real tools the tests run (command:Debian package); installed when missing.
SYSTEM_DEPS := promtool:prometheus prometheus:prometheus \
	prometheus-alertmanager:prometheus-alertmanager chromium:chromium systemd-analyze:systemd
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

system-deps:
	@missing=""; for dep in $(SYSTEM_DEPS); do \
	  command -v $${dep%%:*} >/dev/null 2>&1 || missing="$$missing $${dep#*:}"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y $$missing; \
	fi

# Generated code lives in ncclwatch/v1 (committed); tests fail when it is stale.
proto: $(STAMP)
	$(PY) -m ncclwatch.protogen

# docs/runbooks/*.md are rendered from ncclwatch/remediation.py (tests check).
runbooks: $(STAMP)
	$(PY) -m ncclwatch.runbooks

test: $(STAMP) system-deps
	$(PY) -m pytest

# Unit tests only (no torch jobs): seconds, for the edit loop.
test-fast: $(STAMP)
	$(PY) -m pytest -m "not e2e"

# The scenario matrix alone: real torch jobs, one verdict each, printed as a table.
scenarios: $(STAMP)
	$(PY) -m pytest tests/scenarios -s

demo: $(STAMP)
	$(PY) -m ncclwatch.demo

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
