"""Paged KV cache: fixed-size blocks, per-request block tables and a prefix cache."""

from shared.kvcache.block import FreeBlockQueue, KVBlock
from shared.kvcache.block_pool import BlockPool, KVEvents
from shared.kvcache.manager import KVCacheManager
from shared.kvcache.storage import KVStorage

__all__ = ["BlockPool", "FreeBlockQueue", "KVBlock", "KVCacheManager", "KVEvents", "KVStorage"]
