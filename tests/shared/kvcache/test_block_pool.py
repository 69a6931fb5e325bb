from shared.kvcache import BlockPool, FreeBlockQueue, KVBlock


def test_free_queue_is_lru_and_removes_from_the_middle() -> None:
    blocks = [KVBlock(i) for i in range(4)]
    queue = FreeBlockQueue(blocks)
    queue.remove(blocks[2])
    assert len(queue) == 3 and not queue.contains(blocks[2])
    queue.append(blocks[2])
    assert [queue.popleft().block_id for _ in range(4)] == [0, 1, 3, 2]
    assert len(queue) == 0


def test_allocate_and_free_count_references() -> None:
    pool = BlockPool(4)
    a = pool.allocate(3)
    assert pool.num_free_blocks == 1
    pool.touch(a[:1])
    pool.free(a)
    assert pool.num_free_blocks == 3  # a[0] still has a reference
    pool.free(a[:1])
    assert pool.num_free_blocks == 4


def test_freed_named_block_stays_findable_until_reused() -> None:
    pool = BlockPool(2)
    (block,) = pool.allocate(1)
    pool.name(block, 111)
    pool.free([block])
    assert pool.lookup(111) is block
    pool.touch([block])  # a prefix hit pulls it back out of the free queue
    assert pool.num_free_blocks == 1 and block.ref_cnt == 1
    pool.free([block])
    pool.allocate(2)  # reusing it evicts the name
    assert pool.lookup(111) is None


def test_eviction_takes_least_recently_freed_first() -> None:
    pool = BlockPool(3)
    blocks = pool.allocate(3)
    for block, block_hash in zip(blocks, (1, 2, 3)):
        pool.name(block, block_hash)
    pool.free([blocks[2], blocks[0], blocks[1]])
    pool.allocate(1)
    assert pool.lookup(3) is None and pool.lookup(1) and pool.lookup(2)


def test_events_report_stored_and_removed_hashes() -> None:
    pool = BlockPool(1)
    (block,) = pool.allocate(1)
    pool.name(block, 7)
    pool.free([block])
    pool.allocate(1)
    events = pool.take_events()
    assert events.stored == [7] and events.removed == [7]
    assert not pool.take_events()


def test_duplicate_content_keeps_the_first_name() -> None:
    pool = BlockPool(2)
    a, b = pool.allocate(2)
    pool.name(a, 5)
    pool.name(b, 5)
    assert pool.lookup(5) is a and b.block_hash is None


def test_disabled_prefix_cache_names_nothing() -> None:
    pool = BlockPool(1, enable_prefix_cache=False)
    (block,) = pool.allocate(1)
    pool.name(block, 5)
    assert pool.lookup(5) is None


def test_a_snapshot_names_every_cached_block_and_clears_pending_events() -> None:
    pool = BlockPool(3)
    blocks = pool.allocate(3)
    for block, block_hash in zip(blocks, (7, 8, 9)):
        pool.name(block, block_hash)
    pool.free(blocks[:1])  # freed but still cached: still reusable
    assert sorted(pool.snapshot()) == [7, 8, 9]
    assert not pool.take_events()
