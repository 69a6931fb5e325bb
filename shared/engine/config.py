"""Engine configuration: model, precision, KV cache size and batching limits."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from shared.errors import KvstackError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class EngineConfig:
    model: str = "SmolLM2-135M-Instruct"   # a known name, an HF directory or a .gguf file
    dtype: str = "float32"
    device: str = "cpu"
    block_size: int = 16
    kv_cache_bytes: int = 1 << 30          # ignored when num_blocks is set
    num_blocks: int | None = None
    max_model_len: int | None = None       # default: the model's own limit
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 64
    enable_prefix_cache: bool = True
    enable_chunked_prefill: bool = True
    num_threads: int | None = None         # torch threads for this process
    seed: int = 0

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise KvstackError(f"unknown dtype {self.dtype!r}; choose from {', '.join(DTYPES)}")
        positives = ("block_size", "kv_cache_bytes", "max_num_batched_tokens", "max_num_seqs")
        for name in positives:
            if getattr(self, name) < 1:
                raise KvstackError(f"{name} must be positive, got {getattr(self, name)}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]
