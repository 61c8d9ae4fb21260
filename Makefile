# Two commands on a fresh machine with Python 3.11: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The stamps record which extras are installed; they are remade when what pip reads changes
# (the version lives in _version.py: the metadata must be rewritten when it moves).
# pip compiles the allocation core with mypyc where a C compiler is present (setup.py);
# TENSORARENA_PURE=1 installs the pure-Python build instead. The stamps name the build, so
# switching reinstalls, and depend on the compiled sources, so an edit is never shadowed by a
# stale extension.
BUILD      := $(if $(filter-out 0,$(TENSORARENA_PURE)),pure,compiled)
STAMP_RUN  := $(VENV)/.stamp-run-$(BUILD)
STAMP_TEST := $(VENV)/.stamp-test-$(BUILD)
STAMP_DOCS := $(VENV)/.stamp-docs
VERSION_PY := src/tensorarena/_version.py
# Every module in _version.COMPILED_MODULES (the core, and the array path outside it) and the
# source of each of _version.NATIVE_EXTENSIONS.
BUILD_DEPS := setup.py $(wildcard src/tensorarena/core/*.py) \
              $(wildcard src/tensorarena/adaptors/_thread_cache*.py) src/tensorarena/interop/arrays.py \
              src/tensorarena/interop/_torch_route.py $(wildcard src/tensorarena/interop/_native_*.[ch]) \
              src/tensorarena/planning/exact_lists.py src/tensorarena/planning/exact_pins.py
# The test set-up pins torch to the CPU build on disk (see the file); users get only the extra's floor.
CONSTRAINTS := constraints-test.txt

.PHONY: run test lint docs bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# The main job runs a real model, so it needs torch and transformers (at the pinned CPU build).
$(STAMP_RUN): pyproject.toml $(VERSION_PY) $(CONSTRAINTS) Makefile $(BUILD_DEPS) | $(BIN)/python
	rm -f $(VENV)/.stamp-*
	$(BIN)/pip install -q -c $(CONSTRAINTS) -e '.[torch,models,viz]'
	touch $@

$(STAMP_TEST): pyproject.toml $(VERSION_PY) $(CONSTRAINTS) Makefile $(BUILD_DEPS) | $(BIN)/python
	rm -f $(VENV)/.stamp-*
	$(BIN)/pip install -q -c $(CONSTRAINTS) -e '.[dev,torch,models,onnx,viz,plot]'
	@# The HTML timeline is tested in a real headless browser; its tests skip, saying so, without one.
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  apt-get install -y -qq chromium >/dev/null 2>&1; } || echo "chromium not installed: the browser tests will skip"
	touch $@ $(STAMP_RUN)

run: $(STAMP_RUN)
	$(BIN)/tensorarena demo

test: $(STAMP_TEST)
	$(BIN)/python -m pytest -q

# `make docs` fails on a failing example as on a broken link: the pages' code blocks run first
# (Sybil, through pytest: the test install), then the strict build. The site's pictures are drawn
# at build time by the package and the CLI page imports each command's parser. The docs and plot
# extras' requirements are installed as read from pyproject.toml, not with `pip install -e
# '.[docs]'`, which would rebuild (recompile) the package itself.
EXTRA = $(BIN)/python -c "import sys, tomllib; extras = tomllib.load(open('pyproject.toml', 'rb'))\
	['project']['optional-dependencies']; print('\\n'.join(r for e in sys.argv[1:] for r in extras[e]))"
$(STAMP_DOCS): $(STAMP_TEST) pyproject.toml
	$(EXTRA) docs plot > $(VENV)/docs-requirements.txt
	$(BIN)/pip install -q -c $(CONSTRAINTS) -r $(VENV)/docs-requirements.txt
	touch $@

docs: $(STAMP_DOCS)
	$(BIN)/python -m pytest -q docs README.md
	@# The banner about MkDocs 2.0 is not about this site: keep the output to what matters.
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

lint: $(STAMP_TEST)
	$(BIN)/ruff check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) site build dist src/*.egg-info .pytest_cache .ruff_cache .mypy_cache .hypothesis
	find src -name '*.so' -delete
