import random

from shared.kvpool.hash_ring import HashRing

_rng = random.Random(7)
BLOCKS = [_rng.getrandbits(64) for _ in range(20_000)]


def owners(ring: HashRing) -> dict[int, str]:
    return {h: ring.owner(h) for h in BLOCKS}


def test_every_member_owns_a_fair_share() -> None:
    counts = {}
    for member in owners(HashRing(["a", "b", "c"])).values():
        counts[member] = counts.get(member, 0) + 1
    assert all(0.25 < n / len(BLOCKS) < 0.42 for n in counts.values()), counts


def test_adding_a_member_moves_only_its_share() -> None:
    before, after = owners(HashRing(["a", "b", "c"])), owners(HashRing(["a", "b", "c", "d"]))
    moved = [h for h in BLOCKS if before[h] != after[h]]
    assert all(after[h] == "d" for h in moved)
    assert 0.15 < len(moved) / len(BLOCKS) < 0.35


def test_removing_a_member_moves_only_its_blocks() -> None:
    before, after = owners(HashRing(["a", "b", "c"])), owners(HashRing(["a", "c"]))
    assert all(before[h] == "b" for h in BLOCKS if before[h] != after[h])


def test_agreement_and_empty_ring() -> None:
    assert owners(HashRing(["x", "y"])) == owners(HashRing(["y", "x", "x"]))
    assert HashRing().owner(5) is None and not HashRing()
    assert HashRing(["a", "b"]).group([1, 2, 3]).keys() <= {"a", "b"}
