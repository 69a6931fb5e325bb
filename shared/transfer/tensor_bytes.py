"""A CPU tensor's memory as the bytes the data plane moves (the part of the data-plane
contract that needs torch: shared/transfer/base.py stays importable without it, for the
processes that never hold a tensor: the CLI, the conductor, the gateway)."""

from __future__ import annotations

import torch

from shared.transfer.base import BlockSpan


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor of any dtype, as a flat writable memoryview
    sharing its memory (bfloat16 has no buffer format, hence the uint8 view)."""
    if not tensor.is_contiguous() or tensor.device.type != "cpu":
        raise ValueError("tensor_bytes needs a contiguous CPU tensor")
    return tensor.reshape(-1).view(torch.uint8).numpy().data


def kv_span_bytes(kv: torch.Tensor, layer: int, span: BlockSpan) -> tuple[memoryview, memoryview]:
    """K and V bytes of `span` in a KV tensor laid out as KVStorage's
    `kv[layer, k/v, block, offset, kv_head, head_dim]` (token runs are contiguous)."""
    tokens = slice(span.offset, span.offset + span.num_tokens)
    return (
        tensor_bytes(kv[layer, 0, span.block_id, tokens]),
        tensor_bytes(kv[layer, 1, span.block_id, tokens]),
    )
