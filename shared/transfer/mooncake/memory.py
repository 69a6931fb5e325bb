"""Raw addresses of Python buffers, the allocations behind them, and the copies one frame needs.

The Transfer Engine speaks in addresses and lengths; kvstack hands memoryviews around. Nothing
here imports mooncake, so it is testable without the engine.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from shared.transfer.tensor_bytes import tensor_bytes

Region = tuple[int, int]  # (start address, end address)


@dataclass(frozen=True, slots=True)
class Copy:
    """One contiguous write: `nbytes` from local `source` to the peer's `target` address."""

    source: int
    target: int
    nbytes: int


def views_of(memory: Sequence[torch.Tensor | memoryview]) -> tuple[memoryview, ...]:
    """Flat byte views of tensors (contiguous, CPU) and buffers to register."""
    return tuple(
        tensor_bytes(m) if isinstance(m, torch.Tensor) else memoryview(m).cast("B") for m in memory
    )


def address_of(view: memoryview) -> int:
    """The address of a buffer's first byte."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(view))  # a sixth of numpy's cost
    except (TypeError, ValueError):  # read-only or empty: ctypes refuses those
        return np.frombuffer(view, dtype=np.uint8).ctypes.data


def region_of(view: memoryview) -> Region:
    start = address_of(view)
    return start, start + view.nbytes


def allocation_of(view: memoryview) -> Region:
    """The whole allocation `view` is a window of (a tensor's storage, a bytearray), so that
    registering it once covers every later view into the same memory; the view alone when
    the owner cannot be told."""
    own = region_of(view)
    try:
        whole = _owner_region(view.obj)
    except (TypeError, ValueError, AttributeError, RuntimeError):
        return own
    return whole if whole[0] <= own[0] and own[1] <= whole[1] else own


def _owner_region(owner: object) -> Region:
    while isinstance(owner, np.ndarray) and owner.base is not None:
        owner = owner.base  # tensor_bytes() views are numpy arrays over a torch tensor
    if isinstance(owner, torch.Tensor):
        storage = owner.untyped_storage()
        return storage.data_ptr(), storage.data_ptr() + storage.nbytes()
    if isinstance(owner, np.ndarray):
        return owner.ctypes.data, owner.ctypes.data + owner.nbytes
    if isinstance(owner, (bytes, bytearray, memoryview)):
        return region_of(memoryview(owner).cast("B"))
    raise TypeError(f"cannot tell the allocation of a {type(owner).__name__}")


def coalesced(copies: Iterable[Copy]) -> list[Copy]:
    """The same copies, in source order, with neighbours merged where both sides are
    contiguous: the K halves of consecutive blocks, laid out back to back on both ends, become
    one engine request (each costs tens of microseconds, whatever its size)."""
    merged: list[Copy] = []
    for copy in sorted(copies, key=lambda c: c.source):
        if copy.nbytes == 0:
            continue
        last = merged[-1] if merged else None
        if (
            last
            and last.source + last.nbytes == copy.source
            and last.target + last.nbytes == copy.target
        ):
            merged[-1] = Copy(last.source, last.target, last.nbytes + copy.nbytes)
        else:
            merged.append(copy)
    return merged
