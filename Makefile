# Two commands on a fresh machine with Python 3.11: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The stamp records which extras are installed; it is remade when pyproject.toml changes.
STAMP_RUN  := $(VENV)/.stamp-run
STAMP_TEST := $(VENV)/.stamp-test

.PHONY: run test lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP_RUN): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

# torch==2.13.0 is the CPU build already on disk; the pin keeps pip from fetching a CUDA build.
$(STAMP_TEST): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[dev,torch,onnx]'
	touch $@ $(STAMP_RUN)

run: $(STAMP_RUN)
	$(BIN)/tensorarena bench alloc

test: $(STAMP_TEST)
	$(BIN)/python -m pytest -q

lint: $(STAMP_TEST)
	$(BIN)/ruff check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .ruff_cache .mypy_cache .hypothesis
