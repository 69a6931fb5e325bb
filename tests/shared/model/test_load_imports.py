"""Loading a model stays clear of torch's compiler stack: building on the meta device had
imported torch._dynamo (Embedding's init) and sympy (Module.to_empty), ~2 s of CPU in every
worker's and every CLI command's start."""

from __future__ import annotations

import subprocess
import sys

COMPILER_MODULES = ("torch._dynamo", "sympy", "torch.fx.experimental.symbolic_shapes")

LOAD_BOTH = """
import sys, torch
from shared.model.loader import load_model
from shared.model.quant_loader import load_model_as
from shared.model.registry import DEFAULT_MODEL, gguf_source
load_model(sys.argv[1], torch.float32)
gguf = gguf_source(DEFAULT_MODEL)
assert gguf is not None
load_model_as("auto", sys.argv[2], gguf, torch.float32, "cpu")
print(",".join(m for m in sys.argv[3:] if m in sys.modules))
"""


def test_loading_float_and_gguf_models_imports_no_compiler(tiny_llama_dir, smollm2_dir) -> None:
    args = [str(tiny_llama_dir), str(smollm2_dir), *COMPILER_MODULES]
    result = subprocess.run(
        [sys.executable, "-c", LOAD_BOTH, *args], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"imported while loading: {result.stdout.strip()}"
