"""Llama-family decoder (Llama, Mistral, Qwen2) over a flat batch of tokens.

The model sees tokens of many sequences concatenated ([T]); where each token's KV
goes and what it attends to is the business of the attention backend, reached
through the per-forward `ForwardBatch`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from shared.model import ops
from shared.model.config import ModelConfig
from shared.model.layers import GatedMLP, Linear, RMSNorm
from shared.model.quant import QuantLinear
from shared.model.rope import RotaryEmbedding


@dataclass
class ForwardBatch:
    """What one forward pass needs besides token ids: positions and attention.

    `attention(layer_idx, q, k, v)` stores k, v and returns the attention output
    [T, heads, head_dim]; swapping it is how attention is offloaded. `on_layer_done`
    runs after each layer has written its KV (layer-wise streaming of prefill KV).
    """

    positions: torch.Tensor
    attention: Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    on_layer_done: Callable[[int], None] | None = None
    before_layer: Callable[[int], None] | None = None  # e.g. wait for that layer's loaded KV
    cos: torch.Tensor | None = None
    sin: torch.Tensor | None = None

    def rotary(self) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of the positions, which `LlamaModel.embed` sets before any layer."""
        if self.cos is None or self.sin is None:
            raise RuntimeError("the batch has no rotary tables: embed() sets them")
        return self.cos, self.sin


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads = config.num_heads, config.num_kv_heads
        self.head_dim = config.head_dim
        self.split = (config.q_size, config.kv_size, config.kv_size)
        self.qkv_proj = Linear(config.hidden_size, sum(self.split), bias=config.attention_bias)
        self.o_proj = Linear(config.q_size, config.hidden_size, bias=False)

    def project(self, x: torch.Tensor, batch: ForwardBatch) -> tuple[torch.Tensor, ...]:
        """x [T, hidden] -> q [T, H, D], k and v [T, H_kv, D], rotated at their positions."""
        num_tokens = x.shape[0]
        qkv = self.qkv_proj(x)
        cos, sin = batch.rotary()
        ops.rotary_(qkv, cos, sin, self.num_heads + self.num_kv_heads, self.head_dim)
        q, k, v = qkv.split(self.split, dim=-1)
        return (
            q.view(num_tokens, self.num_heads, self.head_dim),
            k.view(num_tokens, self.num_kv_heads, self.head_dim),
            v.view(num_tokens, self.num_kv_heads, self.head_dim),
        )

    def output(self, attention_out: torch.Tensor) -> torch.Tensor:
        return self.o_proj(attention_out.reshape(attention_out.shape[0], -1))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, batch: ForwardBatch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual stream travels beside x so that each add fuses into the next norm."""
        (q, k, v), residual = self.before_attention(x, residual, batch)
        out = batch.attention(self.self_attn.layer_idx, q, k, v)
        return self.after_attention(out, residual)

    def before_attention(
        self, x: torch.Tensor, residual: torch.Tensor | None, batch: ForwardBatch
    ) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        """The layer up to attention: (q, k, v) and the residual stream. Split from
        `after_attention` so attention can run elsewhere (offloaded) in between."""
        if residual is None:
            x, residual = self.input_layernorm(x), x
        else:
            x, residual = self.input_layernorm.add_norm(x, residual)
        return self.self_attn.project(x, batch), residual

    def after_attention(
        self, attention_out: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.self_attn.output(attention_out)
        x, residual = self.post_attention_layernorm.add_norm(x, residual)
        return self.mlp(x), residual


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        # NOTE: no init of its own: on the meta device (empty_model) Embedding's normal_
        # imported torch._dynamo, 1.5 s of every worker's start; the file fills the weight
        shape = (config.vocab_size, config.hidden_size)
        self.embed_tokens = nn.Embedding(*shape, _weight=torch.empty(shape))
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else Linear(config.hidden_size, config.vocab_size, bias=False)
        )
        self.rotary = RotaryEmbedding(config.rope, config.head_dim)

    def forward(self, input_ids: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """input_ids [T] -> final hidden states [T, hidden]."""
        x = self.embed(input_ids, batch)
        residual: torch.Tensor | None = None
        for layer_idx, layer in enumerate(self.layers):
            if batch.before_layer is not None:
                batch.before_layer(layer_idx)
            x, residual = layer(x, residual, batch)
            if batch.on_layer_done is not None:
                batch.on_layer_done(layer_idx)
        if residual is None:
            raise RuntimeError("a model without layers")
        return self.final_norm(x, residual)

    def embed(self, input_ids: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """Token embeddings; also sets the batch's rotary tables for its positions."""
        batch.cos, batch.sin = self.rotary.cos_sin(batch.positions)
        return self.embed_tokens(input_ids)

    def final_norm(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.norm.add_norm(x, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        head = self.embed_tokens if self.lm_head is None else self.lm_head
        if isinstance(head, QuantLinear):  # quantized weights (shared/model/quant_loader.py)
            return head.linear(hidden).float()
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return ops.linear(hidden, weight, None).float()


def empty_model(config: ModelConfig, device: str, dtype: torch.dtype) -> LlamaModel:
    """A model of `config` on `device` whose weights are whatever memory held: the loaders
    fill them from the files. Built on the meta device, so nothing is initialized twice."""
    with torch.device("meta"):
        model = LlamaModel(config)
    # NOTE: torch.empty, not Module.to_empty: its empty_like of meta tensors goes through
    # torch._refs, which imports sympy (0.4 s of every worker's start)
    return model._apply(
        lambda t: torch.empty(
            t.shape, dtype=dtype if t.is_floating_point() else t.dtype, device=device
        )
    )
