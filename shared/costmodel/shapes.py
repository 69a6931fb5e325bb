"""What a model costs per token: its shape, from presets (cluster-scale models the mock
engine and the simulator stand in for) or from a real model's config."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from shared.model.config import ModelConfig


@dataclass(frozen=True)
class ModelShape:
    name: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    bytes_per_element: int = 2  # bf16 weights and KV

    @functools.cached_property
    def params(self) -> int:
        """Weights read per forward pass (embedding counted once, as the LM head)."""
        attn = self.hidden_size * (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        attn += self.num_heads * self.head_dim * self.hidden_size
        mlp = 3 * self.hidden_size * self.intermediate_size
        return self.num_layers * (attn + mlp) + self.vocab_size * self.hidden_size

    @functools.cached_property
    def weight_bytes(self) -> int:
        return self.params * self.bytes_per_element

    @functools.cached_property
    def kv_bytes_per_token(self) -> int:
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * self.bytes_per_element

    def attention_flops(self, num_new: int, num_context: int) -> float:
        """QK^T and PV for `num_new` tokens attending to `num_context` earlier ones plus,
        causally, to each other."""
        span = num_context + (num_new + 1) / 2
        return 4.0 * self.num_layers * self.num_heads * self.head_dim * num_new * span

    @classmethod
    def of(cls, config: ModelConfig, name: str, bytes_per_element: int = 2) -> ModelShape:
        return cls(
            name,
            config.num_layers,
            config.hidden_size,
            config.intermediate_size,
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
            config.vocab_size,
            bytes_per_element,
        )


MODELS = {
    shape.name: shape
    for shape in (
        ModelShape("llama3-70b", 80, 8192, 28672, 64, 8, 128, 128256),
        ModelShape("llama2-70b", 80, 8192, 28672, 64, 8, 128, 32000),
        ModelShape("llama3-8b", 32, 4096, 14336, 32, 8, 128, 128256),
        ModelShape("qwen2-7b", 28, 3584, 18944, 28, 4, 128, 152064),
        ModelShape("smollm2-135m", 30, 576, 1536, 9, 3, 64, 49152),
    )
}
