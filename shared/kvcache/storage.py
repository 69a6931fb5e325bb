"""The KV tensors: one pool of blocks per layer, addressed by block id and slot."""
from __future__ import annotations

import torch


class KVStorage:
    """KV of every block: `kv[layer, 0 or 1, block_id, offset, kv_head, dim]`.

    A block of one layer is contiguous ([block_size, kv_heads, head_dim] for K,
    then the same for V), so layer-wise streaming sends it without a copy.
    """

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype = torch.float32, device: str = "cpu") -> None:
        self.block_size = block_size
        shape = (num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim)
        self.kv = torch.zeros(shape, dtype=dtype, device=device)

    @property
    def num_blocks(self) -> int:
        return self.kv.shape[2]

    def layer(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.kv[layer_idx, 0], self.kv[layer_idx, 1]

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                        dtype: torch.dtype) -> int:
        element = torch.empty((), dtype=dtype).element_size()
        return num_layers * 2 * block_size * num_kv_heads * head_dim * element
