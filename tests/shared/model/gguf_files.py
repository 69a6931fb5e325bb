"""GGUF files for tests: a file's tensors re-encoded into a new one, and Q4_K blocks from float
weights (the gguf package dequantizes Q4_K but cannot quantize into it: here a plain rounding,
each sub-block of 32 values scaled from its own minimum and range, the scales and mins then
rounded to 6 bits of the super-block's d and dmin, not llama.cpp's searched one; what the
kernels read is the layout, which is GGML's)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np

from shared.model.gguf_index import read_tensors

SUPER, SUB = 256, 32
# (tensor name, its float values on demand) -> (data, type) to re-encode it as, or None
Encode = Callable[[str, Callable[[], np.ndarray]], tuple[np.ndarray, int] | None]


def write_recoded(path: Path, source: Path, encode: Encode) -> Path:
    """`source`'s tensors into a new GGUF at `path`, those `encode` answers for re-encoded."""
    writer = gguf.GGUFWriter(str(path), "llama")
    for tensor in read_tensors(source):
        kind = gguf.GGMLQuantizationType(tensor.ggml_type)
        data = np.asarray(tensor.data)
        floats = lambda data=data, kind=kind, shape=tensor.shape: gguf.quants.dequantize(
            data, kind
        ).reshape(shape)
        recoded = encode(tensor.name, floats)
        if recoded is not None:
            data, kind = recoded[0], gguf.GGMLQuantizationType(recoded[1])
        elif kind == gguf.GGMLQuantizationType.F32:
            data = data.view(np.float32).reshape(tensor.shape)
        writer.add_tensor(tensor.name, data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def quantize_q4_k(weight: np.ndarray) -> np.ndarray:
    """float32 [N, K] (K a multiple of 256) -> uint8 [N, K / 256 * 144]: per super-block fp16
    d, fp16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles."""
    n, k = weight.shape
    x = weight.astype(np.float32).reshape(n * k // SUPER, SUPER // SUB, SUB)
    low = np.minimum(x.min(axis=2), 0.0)  # [blocks, 8]: each sub-block's offset is -dmin * mn
    span = (x.max(axis=2) - low) / 15
    d = (span.max(axis=1) / 63).astype(np.float16)
    dmin = (-low.min(axis=1) / 63).astype(np.float16)
    sc = np.clip(np.rint(span / safe(d)[:, None]), 0, 63).astype(np.uint8)
    mn = np.clip(np.rint(-low / safe(dmin)[:, None]), 0, 63).astype(np.uint8)
    scale = d.astype(np.float32)[:, None] * sc  # what the dequantization will multiply by
    offset = dmin.astype(np.float32)[:, None] * mn
    q = np.rint((x + offset[..., None]) / safe(scale)[..., None])
    q = np.clip(q, 0, 15).astype(np.uint8)  # [blocks, 8, 32]
    # sub-blocks 2c and 2c + 1 share chunk c's 32 bytes: low nibbles, then high ones
    nibbles = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(-1, 128)
    scalars = [d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2)]
    out = np.concatenate([*scalars, packed(sc, mn), nibbles], axis=1)
    return out.reshape(n, k // SUPER * 144)


def safe(v: np.ndarray) -> np.ndarray:
    v = v.astype(np.float32)
    return np.where(v > 0, v, 1.0)


def packed(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """8 6-bit scales and mins [blocks, 8] -> GGML's 12 bytes (quant_blocks.h: q4k_scale_min
    reads them back)."""
    s = np.zeros((sc.shape[0], 12), dtype=np.uint8)
    s[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    s[:, 4:8] = (mn[:, 0:4] & 63) | ((mn[:, 4:8] >> 4) << 6)
    s[:, 8:12] = (sc[:, 4:8] & 0x0F) | ((mn[:, 4:8] & 0x0F) << 4)
    return s
