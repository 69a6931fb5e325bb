from shared.hashing import block_hashes, chain_hash, root_hash


def test_golden_vectors() -> None:
    # Changing these renames every block in a running cluster and in every kvstore.
    assert root_hash("kvstack") == 0x822967E5C9EE97D1
    assert chain_hash(root_hash("kvstack"), [1, 2, 3, 4]) == 4375029294662113996
    assert block_hashes(list(range(8)), 4) == [735313504152804024, 8653456353146955942]
    assert chain_hash(0, [1, 2, 3, 4]) == chain_hash(0, (1, 2, 3, 4))


def test_only_full_blocks_are_hashed() -> None:
    assert len(block_hashes(list(range(10)), 4)) == 2
    assert block_hashes(list(range(3)), 4) == []


def test_a_hash_names_the_whole_prefix() -> None:
    a = block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4)
    b = block_hashes([9, 2, 3, 4, 5, 6, 7, 8], 4)
    assert a[1] != b[1]  # same second block, different first block
    assert block_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], 4) == a


def test_namespace_separates_models() -> None:
    assert block_hashes([1, 2, 3, 4], 4, "model-a") != block_hashes([1, 2, 3, 4], 4, "model-b")


def test_chain_can_be_extended_from_a_known_parent() -> None:
    tokens = list(range(20))
    whole = block_hashes(tokens, 4)
    assert block_hashes(tokens, 4, start=2, parent=whole[1]) == whole[2:]
