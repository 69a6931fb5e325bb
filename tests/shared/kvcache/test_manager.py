from shared.hashing import block_hashes
from shared.kvcache import KVCacheManager


def test_allocation_grows_by_whole_blocks() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=4)
    assert kv.allocate_slots("a", 5)
    assert len(kv.block_ids("a")) == 2
    assert kv.allocate_slots("a", 8)
    assert len(kv.block_ids("a")) == 2
    assert kv.allocate_slots("a", 9)
    assert len(kv.block_ids("a")) == 3 and kv.num_free_blocks == 5


def test_out_of_blocks_reports_false_and_changes_nothing() -> None:
    kv = KVCacheManager(num_blocks=3, block_size=4)
    assert kv.allocate_slots("a", 8)
    assert not kv.allocate_slots("b", 8)
    assert kv.block_ids("b") == [] and kv.num_free_blocks == 1
    assert not kv.allocate_slots("a", 13)
    assert len(kv.block_ids("a")) == 2


def test_prefix_hit_reuses_blocks_of_a_finished_request() -> None:
    kv = KVCacheManager(num_blocks=6, block_size=4)
    tokens = list(range(10))
    hashes = block_hashes(tokens, 4)
    kv.allocate_slots("a", 10)
    kv.name_full_blocks("a", hashes, 10)
    first_blocks = kv.block_ids("a")
    kv.free("a")
    cached = kv.match_prefix(block_hashes(tokens[:8] + [99, 98, 97, 96], 4))
    assert [b.block_id for b in cached] == first_blocks[:2]
    assert kv.allocate_slots("b", 12, cached)
    assert kv.block_ids("b")[:2] == first_blocks[:2]


def test_cached_blocks_in_the_free_queue_count_against_space() -> None:
    kv = KVCacheManager(num_blocks=2, block_size=4)
    kv.allocate_slots("a", 4)
    kv.name_full_blocks("a", block_hashes(list(range(4)), 4), 4)
    kv.free("a")
    cached = kv.match_prefix(block_hashes(list(range(4)), 4))
    # 2 free blocks, one of which is the hit itself: 8 tokens fit, 12 do not.
    assert not kv.can_allocate("b", 12, cached)
    assert kv.allocate_slots("b", 8, cached)
    assert kv.num_free_blocks == 0


def test_only_computed_full_blocks_are_named() -> None:
    kv = KVCacheManager(num_blocks=4, block_size=4)
    tokens = list(range(12))
    kv.allocate_slots("a", 12)
    kv.name_full_blocks("a", block_hashes(tokens, 4), 7)
    assert len(kv.match_prefix(block_hashes(tokens, 4))) == 1
    kv.name_full_blocks("a", block_hashes(tokens, 4), 12)
    assert len(kv.match_prefix(block_hashes(tokens, 4))) == 3


def test_free_releases_everything_and_tail_is_evicted_first() -> None:
    kv = KVCacheManager(num_blocks=3, block_size=2)
    tokens = list(range(6))
    kv.allocate_slots("a", 6)
    kv.name_full_blocks("a", block_hashes(tokens, 2), 6)
    kv.free("a")
    assert kv.num_free_blocks == 3 and kv.usage == 0.0
    kv.allocate_slots("b", 2)  # takes the LRU block: the tail of "a"
    assert len(kv.match_prefix(block_hashes(tokens, 2))) == 2
