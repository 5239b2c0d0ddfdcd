# kvtrace: every target bootstraps .venv on first use (idempotent; re-run when pyproject changes).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.kvtrace-installed
SGLANG_VERSION := 0.5.23
PYTEST_ARGS ?=

.PHONY: venv demo test bench lab data sglang clean-venv fork-env

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "torch==2.13.0" -e ".[replay,analysis,sglang,server,ray,dev]"
	$(BIN)/python -m pip install -q --no-deps "sglang==$(SGLANG_VERSION)" "xgrammar==0.2.9"
	touch $(STAMP)

venv: $(STAMP)

sglang: $(STAMP)

# Headless Chromium for tests/report (the report's DOM and screenshot checks): Debian's chromium,
# installed with apt only when missing and we are root (CI); idempotent. Without it those tests skip.
.PHONY: chromium
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	{ if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  { DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } || \
	  echo "chromium: apt-get could not install it: the browser tests skip (reason in pytest's summary)"; \
	  else echo "chromium: missing and not installable here (not root or no apt-get): the browser tests skip"; fi; }

test: chromium

demo: $(STAMP)
	$(BIN)/python -m replay.demo

# The DeepSeek-V4 fork's CPU environment (docs/fork.md): both shared commits unpacked and their
# pins installed in .kvtrace-codes/ (cached by content; never in .venv). Skipped without ../shared.
SHARED ?= ../shared
FORK_TARBALLS := $(SHARED)/targets/bytedance-dsv4/sglang-pre659.tar.xz $(SHARED)/targets/bytedance-dsv4/sglang-post659.tar.xz

fork-env: $(STAMP)
	@if [ -d "$(SHARED)/targets/bytedance-dsv4" ]; then $(BIN)/python -m replay.codes prepare $(FORK_TARBALLS); \
	else echo "fork-env: $(SHARED)/targets/bytedance-dsv4 absent: the fork's environment is not prepared (tests/fork skip)"; fi

test: $(STAMP) fork-env
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup --durations=25 $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python bench/tracer_overhead.py
	$(BIN)/python bench/sglang_overhead.py

data: $(STAMP)
	$(BIN)/python -m replay.workloads.make_data

lab: $(STAMP)
	$(BIN)/kvtrace lab $(LAB_PATH)

clean-venv:
	rm -rf $(VENV)
