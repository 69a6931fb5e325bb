"""GGML block formats that the native kernels read as they are (shared/model/kernels/quant_ops.cpp).

A quantized weight is a uint8 tensor [out_features, row_bytes]: each row is its own run of
blocks, so rows of several GGUF tensors can be concatenated into one fused weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class QuantFormat:
    name: str
    ggml_type: int  # gguf.GGMLQuantizationType
    block_values: int
    block_bytes: int

    def row_bytes(self, in_features: int) -> int:
        if in_features % self.block_values:
            raise ValueError(
                f"{self.name} needs rows of a multiple of {self.block_values} values, "
                f"not {in_features}"
            )
        return in_features // self.block_values * self.block_bytes

    def bits_per_weight(self) -> float:
        return 8 * self.block_bytes / self.block_values


FORMATS = {
    f.name: f
    for f in (
        QuantFormat("q8_0", 8, 32, 34),
        QuantFormat("q4_0", 2, 32, 18),
        QuantFormat("q4_1", 3, 32, 20),
        QuantFormat("q5_0", 6, 32, 22),
        QuantFormat("q4_k", 12, 256, 144),
    )
}
# Formats a float weight can be re-quantized into at load (by the gguf package's quantizers).
REQUANTIZABLE = ("q8_0", "q4_0", "q4_1")


def format_of(ggml_type: int) -> QuantFormat | None:
    """The kernels' format for a GGML tensor type, or None where they have none."""
    return next((f for f in FORMATS.values() if f.ggml_type == int(ggml_type)), None)


def quantize(weight: torch.Tensor, fmt: QuantFormat) -> torch.Tensor:
    """A float weight [N, K] -> its blocks [N, row_bytes] (ggml's own rounding)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize as gguf_quantize

    fmt.row_bytes(weight.shape[1])  # refuses a row length the format cannot hold
    array = weight.detach().float().cpu().numpy()
    blocks = gguf_quantize(array, GGMLQuantizationType(fmt.ggml_type))
    return torch.from_numpy(np.ascontiguousarray(blocks).view(np.uint8))


def random_blocks(fmt: QuantFormat, rows: int, in_features: int, seed: int) -> torch.Tensor:
    """Blocks [rows, row_bytes] of random bytes with small finite fp16 scales where the format
    keeps them (d, and m or dmin, lead each block): for kernels' tests and timings, and for
    formats the gguf package cannot quantize into (Q4_K)."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(
        0, 256, (rows, fmt.row_bytes(in_features) // fmt.block_bytes, fmt.block_bytes)
    )
    blocks = blocks.astype(np.uint8)
    scales = 2 if fmt.name in ("q4_1", "q4_k") else 1
    halves = rng.uniform(-0.05, 0.05, (rows, blocks.shape[1], scales)).astype(np.float16)
    blocks[..., : 2 * scales] = halves.view(np.uint8)
    return torch.from_numpy(blocks.reshape(rows, -1).copy())


def dequantize(blocks: torch.Tensor, fmt: QuantFormat) -> torch.Tensor:
    """The reference: blocks [N, row_bytes] -> float32 [N, K] by the gguf package."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize

    array = gguf_dequantize(blocks.numpy(), GGMLQuantizationType(fmt.ggml_type))
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))


# Formats whose values Q8_0 holds exactly: d * (q - 8), q < 16, and d * (q - 16), q < 32.
EXACT_IN_Q8_0 = {"q4_0": 8, "q5_0": 16}  # the offset each subtracts


def as_q8_0(blocks: torch.Tensor, fmt: QuantFormat) -> torch.Tensor:
    """Q4_0 or Q5_0 blocks [N, row_bytes] -> Q8_0 blocks holding exactly the same values:
    each block's d kept, its quants q stored as the int8 q - offset."""
    q8 = FORMATS["q8_0"]
    rows = blocks.numpy().reshape(blocks.shape[0], -1, fmt.block_bytes)
    packed = rows[..., -16:]  # the 16 bytes of nibbles end both formats' blocks
    quants = np.concatenate([packed & 0x0F, packed >> 4], axis=-1)
    if fmt.name == "q5_0":  # 4 bytes after d: bit i is value i's fifth bit
        bits = rows[..., 2:6].copy().view("<u4")
        quants |= (((bits >> np.arange(32, dtype=np.uint32)) & 1) << 4).astype(np.uint8)
    values = quants.astype(np.int16) - EXACT_IN_Q8_0[fmt.name]
    out = np.empty((*rows.shape[:2], q8.block_bytes), dtype=np.uint8)
    out[..., :2] = rows[..., :2]
    out[..., 2:] = values.astype(np.int8).view(np.uint8)
    return torch.from_numpy(out.reshape(blocks.shape[0], -1))
