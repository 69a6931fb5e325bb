"""Attention over the paged KV cache, behind one backend interface.

The runner orders a step's tokens as: decode tokens first (one per sequence,
batched together), then prefill chunks (each attends over its cached prefix and
itself, causally). A backend stores the new k, v at `slot_mapping` and computes
attention for both groups.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from shared.kvcache.storage import KVStorage
from shared.model import ops


@dataclass
class PrefillSpan:
    token_start: int  # first row of the chunk in the step's flat token batch
    num_tokens: int  # tokens computed in this chunk
    context_len: int  # tokens in the KV once the chunk is written
    # With a cached prefix: the blocks holding the whole context, and the causal mask
    # (built once per step, used by every layer). None: no prefix, attend to the chunk.
    context_blocks: torch.Tensor | None = None
    first_block: int | None = None  # set when context_blocks are consecutive: a view
    mask: torch.Tensor | None = None

    def context(self, cache: torch.Tensor) -> torch.Tensor:
        """[context_len, H_kv, D] of one layer's K or V cache, copying only if scattered."""
        context_blocks = self.context_blocks
        if context_blocks is None:
            raise ValueError("a span without a cached prefix attends to its chunk alone")
        if self.first_block is not None:
            blocks = cache[self.first_block : self.first_block + len(context_blocks)]
        else:
            blocks = cache.index_select(0, context_blocks)
        return blocks.flatten(0, 1)[: self.context_len]


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] where each new token's k, v go
    num_decode_tokens: int = 0
    decode_block_table: torch.Tensor | None = None  # [B, max_blocks]
    decode_context_lens: torch.Tensor | None = None  # [B] tokens each sequence attends over
    decode_max_context: int = 0  # the largest of them

    def decode_tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The decode block table and context lengths, set whenever there are decode tokens."""
        if self.decode_block_table is None or self.decode_context_lens is None:
            raise ValueError("decode attention without a block table")
        return self.decode_block_table, self.decode_context_lens

    prefills: list[PrefillSpan] = field(default_factory=list)


class AttentionBackend(Protocol):
    def forward(
        self,
        layer_idx: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """q [T, H, D], k and v [T, H_kv, D] -> [T, H, D]; writes k, v into the cache."""


class TorchPagedAttention:
    """Reference backend in plain torch (CPU, or any device torch supports)."""

    name = "torch"

    def __init__(self, storage: KVStorage, head_dim: int) -> None:
        self.storage = storage
        self.scale = head_dim**-0.5
        # What prompts attend in under torch's kernel where it differs from the KV's dtype:
        # bfloat16 where the prompt's matmuls multiply in it (float32 KV with quantized weights
        # on a CPU with native bfloat16: EngineConfig.prefill_matmul_dtype); None: the KV's
        # own. The native CPU kernel attends in float32 whatever this says (and faster).
        self.prefill_dtype: torch.dtype | None = None
        # False: prompts attend through torch's kernel even where the native one is built
        # (a benchmark's "before": python -m bench engine --before torch-prompt-attention).
        self.native_prefill = True

    def forward(
        self,
        layer_idx: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        k_cache, v_cache = self.storage.layer(layer_idx)
        ops.write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        num_decode = meta.num_decode_tokens
        if not meta.prefills:
            table, lens = meta.decode_tables()
            return ops.decode_attention(q, k_cache, v_cache, table, lens, self.scale)
        out = torch.empty_like(q)
        if num_decode:
            table, lens = meta.decode_tables()
            out[:num_decode] = ops.decode_attention(
                q[:num_decode], k_cache, v_cache, table, lens, self.scale
            )
        for span in meta.prefills:
            rows = slice(span.token_start, span.token_start + span.num_tokens)
            if span.context_blocks is None:
                out[rows] = self._prefill(q[rows], k[rows], v[rows], None)
            else:
                out[rows] = self._prefill(
                    q[rows], span.context(k_cache), span.context(v_cache), span.mask
                )
        return out

    def _prefill(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """Causal attention: over the chunk itself (mask None) or over prefix + chunk."""
        attend = ops.prefill_attention if self.native_prefill else ops.prefill_attention_torch
        return attend(q, k, v, self.scale, mask, self.prefill_dtype)


def causal_mask(num_tokens: int, context_len: int) -> torch.Tensor:
    """[num_tokens, context_len]: new token i sees context positions up to its own."""
    last_visible = torch.arange(context_len - num_tokens, context_len)[:, None]
    return torch.arange(context_len)[None, :] <= last_visible
