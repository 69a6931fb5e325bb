"""The KV tensors: one pool of blocks per layer, addressed by block id and slot."""

from __future__ import annotations

import math
import os

import numpy as np
import torch

from shared import huge_pages as host_memory

# Keep a host mirror even on CPU, so the tests exercise a GPU worker's staging there.
HOST_MIRROR_ENV = "KVSTACK_KV_HOST_MIRROR"


class KVStorage:
    """KV of every block: `kv[layer, 0 or 1, block_id, offset, kv_head, dim]`.

    A block of one layer is contiguous ([block_size, kv_heads, head_dim] for K,
    then the same for V), so layer-wise streaming sends it without a copy.

    The data plane reads and writes host bytes (`span_bytes`). On a GPU those are a
    pinned host mirror of the KV, made at its first use (a worker that never moves KV
    never pays its memory): senders copy a span to it first (`to_host`), receivers copy
    a span they filled back (`to_device`). On CPU both are no-ops and the bytes are the
    KV itself.
    """

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: str = "cpu",
        huge_pages: bool = True,
    ) -> None:
        self.block_size = block_size
        shape = (num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim)
        # NOTE: on the host in huge pages: decode attention streams it every step
        self.kv = (
            host_memory.zeros(shape, dtype)
            if device == "cpu" and huge_pages
            else torch.zeros(shape, dtype=dtype, device=device)
        )
        self.token_bytes = num_kv_heads * head_dim * self.kv.element_size()
        self._bytes: memoryview | None = None
        self._blocks: np.ndarray | None = None  # blocks_array's base, made at its first use
        self.mirrored = self.kv.is_cuda or os.environ.get(HOST_MIRROR_ENV) == "1"
        self._mirror: torch.Tensor | None = None

    @property
    def num_blocks(self) -> int:
        return self.kv.shape[2]

    def layer(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.kv[layer_idx, 0], self.kv[layer_idx, 1]

    def span_bytes(
        self, layer: int, block_id: int, offset: int, num_tokens: int
    ) -> tuple[memoryview, memoryview]:
        """K and V bytes of tokens [offset, offset + num_tokens) of one block of one layer.

        Plain arithmetic on one memoryview of the whole tensor: the data plane asks for
        thousands of these per request, and tensor indexing would cost 30x more.
        """
        return self.spans_of_layers(range(layer, layer + 1), block_id, offset, num_tokens)[0]

    def spans_of_layers(
        self, layers: range, block_id: int, offset: int, num_tokens: int
    ) -> list[tuple[memoryview, memoryview]]:
        """`span_bytes` of each of `layers`, in order (what a frame of many layers lands in)."""
        flat = self.flat_bytes()
        half = self.block_size * self.token_bytes
        step = 2 * self.num_blocks * half  # from one layer's K to the next's
        first = layers.start * step + block_id * half + offset * self.token_bytes
        to_v = self.num_blocks * half
        n = num_tokens * self.token_bytes
        return [
            (flat[k : k + n], flat[k + to_v : k + to_v + n])
            for k in range(first, first + len(layers) * step, step)
        ]

    def blocks_array(self, block_id: int, count: int) -> np.ndarray:
        """Blocks [block_id, block_id + count) as one uint8 array [layer, K or V, block,
        byte]: a view of the host bytes that the data plane writes, one copy filling all."""
        if self._blocks is None:
            kv = self.host()
            shape = (*kv.shape[:3], math.prod(kv.shape[3:]) * kv.element_size())
            self._blocks = kv.view(torch.uint8).reshape(shape).numpy()
        return self._blocks[:, :, block_id : block_id + count]

    def flat_bytes(self) -> memoryview:
        if self._bytes is None:
            self._bytes = self.host().reshape(-1).view(torch.uint8).numpy().data
        return self._bytes

    def host(self) -> torch.Tensor:
        """The KV the data plane reads and writes: itself, or its host mirror."""
        if not self.mirrored:
            return self.kv
        if self._mirror is None:
            self._mirror = torch.zeros(
                self.kv.shape, dtype=self.kv.dtype, pin_memory=self.kv.is_cuda
            )
        return self._mirror

    def to_host(self, layer: int, block_id: int, offset: int, num_tokens: int) -> None:
        """K and V of a token run (from a block's `offset`, through consecutive blocks)
        into the host mirror, before the data plane reads them; returns once copied."""
        if self.mirrored:
            self._copy_run(self.kv, self.host(), layer, block_id, offset, num_tokens)

    def to_device(self, layer: int, block_id: int, offset: int, num_tokens: int) -> None:
        """A token run the data plane wrote into the host mirror, onto the device."""
        if self.mirrored:
            self._copy_run(self.host(), self.kv, layer, block_id, offset, num_tokens)

    def _copy_run(
        self,
        src: torch.Tensor,
        dst: torch.Tensor,
        layer: int,
        block_id: int,
        offset: int,
        num_tokens: int,
    ) -> None:
        start = block_id * self.block_size + offset
        tokens = slice(start, start + num_tokens)
        for half in (0, 1):
            dst[layer, half].flatten(0, 1)[tokens].copy_(src[layer, half].flatten(0, 1)[tokens])

    @staticmethod
    def bytes_per_block(
        num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        element = torch.empty((), dtype=dtype).element_size()
        return num_layers * 2 * block_size * num_kv_heads * head_dim * element
