"""Where each tensor of a GGUF file lies, read without parsing the metadata's values.

The gguf package's reader builds every metadata field (for a 49k-token vocabulary, seconds of
Python); loading weights needs only the tensor table after them, so this skips the values.
Layout (GGUF v2/v3, little-endian): magic, version, tensor count, metadata count, the
metadata (key, type, value), then per tensor: name, dims (innermost first), type, offset;
tensor data starts at the next multiple of `general.alignment` (default 32).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shared.errors import UnsupportedModel

# Sizes of GGUF metadata value types (8: string, 9: array are variable).
SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY, UINT32 = 8, 9, 4


@dataclass(frozen=True)
class TensorEntry:
    name: str
    shape: tuple[int, ...]  # outermost first (rows, columns), as torch orders them
    ggml_type: int
    data: np.ndarray  # uint8 [rows, row_bytes] (1-D tensors: [1, bytes]), memory-mapped


def read_tensors(path: Path) -> list[TensorEntry]:
    """Every tensor of the GGUF file at `path`, its bytes memory-mapped."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    raw = np.memmap(path, dtype=np.uint8, mode="r")
    reader = _Cursor(raw.data)
    if reader.take(4) != b"GGUF" or reader.unpack("<I") not in (2, 3):
        raise UnsupportedModel(f"{path} is not a GGUF v2/v3 file")
    num_tensors, num_fields = reader.unpack("<Q"), reader.unpack("<Q")
    alignment = 32
    for _ in range(num_fields):
        key, kind = reader.string(), reader.unpack("<I")
        if key == "general.alignment" and kind == UINT32:
            alignment = reader.unpack("<I")
        else:
            reader.skip_value(kind)
    infos = [reader.tensor_info() for _ in range(num_tensors)]
    start = -(-reader.at // alignment) * alignment
    entries = []
    for name, dims, kind, offset in infos:
        values, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        row_bytes = dims[0] // values * nbytes
        rows = int(np.prod(dims[1:], dtype=np.int64)) if len(dims) > 1 else 1
        data = raw[start + offset : start + offset + rows * row_bytes].reshape(rows, row_bytes)
        entries.append(TensorEntry(name, tuple(reversed(dims)), kind, data))
    return entries


class _Cursor:
    def __init__(self, buffer: memoryview) -> None:
        self.buffer, self.at = buffer, 0

    def take(self, n: int) -> bytes:
        chunk = bytes(self.buffer[self.at : self.at + n])
        self.at += n
        return chunk

    def unpack(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.buffer, self.at)
        self.at += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        return self.take(self.unpack("<Q")).decode("utf-8", errors="replace")

    def skip_value(self, kind: int) -> None:
        if kind == STRING:
            length = self.unpack("<Q")  # NOTE: `self.at += self.unpack()` would lose 8 bytes
            self.at += length
        elif kind == ARRAY:
            item, count = self.unpack("<I"), self.unpack("<Q")
            if item in SCALAR_SIZES:
                self.at += SCALAR_SIZES[item] * count
            else:
                for _ in range(count):
                    self.skip_value(item)
        else:
            self.at += SCALAR_SIZES[kind]

    def tensor_info(self) -> tuple[str, list[int], int, int]:
        name, num_dims = self.string(), self.unpack("<I")
        dims = [self.unpack("<Q") for _ in range(num_dims)]
        return name, dims, self.unpack("<I"), self.unpack("<Q")
