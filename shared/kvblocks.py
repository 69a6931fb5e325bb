"""A KV block as bytes: the layout workers and the kvstore agree on.

A block holds `block_size` tokens of every layer. Its bytes are layer-major:
for each layer, the K half then the V half, each `half_bytes` long (the contiguous
[block_size, kv_heads, head_dim] slab of KVStorage). The data plane moves one layer of
many blocks per frame, so a block can land (and be used) layer by layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class KVTensor(Protocol):
    """The part of KVStorage's tensor a layout is read from; named here, not imported, so
    this module (and the messages that carry a layout) need no torch."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    def element_size(self) -> int: ...


class HasKV(Protocol):
    """A KVStorage (shared.kvcache.storage), as far as `BlockLayout.of` needs it."""

    @property
    def kv(self) -> KVTensor: ...


@dataclass(frozen=True, slots=True)
class BlockLayout:
    num_layers: int
    block_size: int  # tokens per block
    half_bytes: int  # bytes of K (and of V) of one layer of one block

    def __post_init__(self) -> None:
        if min(self.num_layers, self.block_size, self.half_bytes) < 1:
            raise ValueError(f"a block layout needs positive sizes: {self}")

    @property
    def block_bytes(self) -> int:
        return self.num_layers * 2 * self.half_bytes

    def offset(self, layer: int, half: int) -> int:
        """Where layer `layer`'s K (half 0) or V (half 1) starts inside a block's bytes."""
        return (2 * layer + half) * self.half_bytes

    @classmethod
    def of(cls, storage: HasKV) -> BlockLayout:
        num_layers, _, _, block_size, kv_heads, head_dim = storage.kv.shape
        element = storage.kv.element_size()
        return cls(num_layers, block_size, block_size * kv_heads * head_dim * element)
