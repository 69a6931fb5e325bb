"""How a decode worker's attention group splits the KV heads: what the decode worker (which
forms the group), each attention worker (which holds a share) and `kvstack up` (which
checks the flags before it starts anything) must agree on."""

from __future__ import annotations

from shared.errors import KvstackError


def kv_head_range(num_kv_heads: int, group_size: int, shard: int) -> tuple[int, int]:
    """The KV heads of shard `shard`; whole heads only, so GQA groups stay together."""
    if group_size < 1 or num_kv_heads % group_size:
        raise KvstackError(
            f"an attention group of {group_size} worker(s) cannot split {num_kv_heads} KV "
            f"heads evenly; use a group size that divides {num_kv_heads}"
        )
    if not 0 <= shard < group_size:
        raise KvstackError(f"shard {shard} is outside a group of {group_size}")
    per_shard = num_kv_heads // group_size
    return shard * per_shard, (shard + 1) * per_shard


def usable_group_size(num_kv_heads: int, num_live: int) -> int:
    """The largest group of at most `num_live` workers that splits the KV heads evenly."""
    return max((n for n in range(1, num_live + 1) if num_kv_heads % n == 0), default=0)
