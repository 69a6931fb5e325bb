"""Zeroed host memory backed by transparent huge pages where the kernel grants them.

What a CPU decode step streams every step, the weights and the KV pool, sits in 2 MiB pages
instead of 4 KiB ones: fewer TLB misses, and streams the prefetchers follow further
(docs/notes/2026-11-26-amx-xeon.md, "Decode's weights in huge pages").
"""

from __future__ import annotations

import logging
import math
import mmap

import torch

log = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20


def zeros_bytes(nbytes: int) -> torch.Tensor:
    """`nbytes` of zeroed uint8 memory aligned to a huge page, asked to be backed by huge pages
    (MADV_HUGEPAGE: granted where transparent huge pages are `always` or `madvise`)."""
    region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None:
        try:
            region.madvise(advice)
        except OSError as e:  # a kernel without transparent huge pages: 4 KiB pages then
            log.info("no huge pages here (%s)", e)
    # NOTE: the tensor keeps `region` alive (frombuffer holds the buffer), so the mapping
    # lives exactly as long as views of it do.
    whole = torch.frombuffer(region, dtype=torch.uint8)
    start = -whole.data_ptr() % HUGE_PAGE
    memory = whole[start : start + nbytes]
    # NOTE: every page touched now, as torch.zeros does: the memory is the process's from the
    # start (a KV pool the machine cannot hold fails at start, not in a request's step).
    return memory.zero_()


def zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """torch.zeros(shape, dtype=dtype) on the host, in huge pages (an empty shape: plain)."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    return zeros_bytes(nbytes).view(dtype).view(shape)
