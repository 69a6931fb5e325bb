"""Host memory in huge pages (shared/huge_pages.py): aligned, zeroed, as long as asked, backed
by huge pages where the kernel grants them to madvised memory, and what the KV pool lives in."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shared.huge_pages import HUGE_PAGE, zeros, zeros_bytes
from shared.kvcache.storage import KVStorage


def test_the_memory_is_aligned_zeroed_and_as_long_as_asked() -> None:
    memory = zeros_bytes(3 * HUGE_PAGE + 5)
    assert memory.numel() == 3 * HUGE_PAGE + 5 and memory.dtype == torch.uint8
    assert memory.data_ptr() % HUGE_PAGE == 0
    assert not memory.any()


def thp_setting(name: str) -> str:
    try:
        text = Path(f"/sys/kernel/mm/transparent_hugepage/{name}").read_text()
    except OSError:
        return "never"
    return text.split("[")[1].split("]")[0]


needs_huge_pages = pytest.mark.skipif(
    thp_setting("enabled") == "never" or thp_setting("defrag") in ("never", "defer"),
    reason="no transparent huge pages for madvised memory here (or no compaction for them)",
)


@needs_huge_pages
def test_the_memory_is_backed_by_huge_pages() -> None:
    memory = zeros_bytes(4 * HUGE_PAGE)
    memory.fill_(1)  # pages exist once touched
    assert huge_page_bytes(memory.data_ptr()) >= HUGE_PAGE


def huge_page_bytes(address: int) -> int:
    """AnonHugePages of the mapping of this process that holds `address`."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            start, end = (int(part, 16) for part in head.split("-"))
            inside = start <= address < end
        elif inside and head == "AnonHugePages:":
            return int(line.split()[1]) * 1024
    return 0


def test_zeros_of_a_shape_and_of_none() -> None:
    kv = zeros((2, 3, 5), torch.bfloat16)
    assert kv.shape == (2, 3, 5) and kv.dtype == torch.bfloat16 and not kv.any()
    assert zeros((0, 4), torch.float32).shape == (0, 4)


@needs_huge_pages
def test_the_kv_pool_on_the_host_lives_in_huge_pages() -> None:
    storage = KVStorage(4, 64, 16, 3, 64)  # 12 MiB of float32 KV
    storage.kv.fill_(1.0)
    assert storage.kv.data_ptr() % HUGE_PAGE == 0
    assert huge_page_bytes(storage.kv.data_ptr()) >= HUGE_PAGE
