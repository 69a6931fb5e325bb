"""Consistent hashing of block hashes onto kvstore instances.

Each member owns many points on a 64-bit ring; a block belongs to the first point at
or after its hash. Adding or removing a member moves only the blocks of the arcs it
gains or loses (about 1/n of them), and every worker with the same member list agrees.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

import xxhash

POINTS_PER_MEMBER = 128


class HashRing:
    def __init__(self, members: Iterable[str] = (), points: int = POINTS_PER_MEMBER) -> None:
        self.members = tuple(sorted(set(members)))
        ring = sorted(
            (xxhash.xxh3_64_intdigest(f"{member}#{i}".encode()), member)
            for member in self.members
            for i in range(points)
        )
        self._points = [point for point, _ in ring]
        self._owners = [member for _, member in ring]

    def __bool__(self) -> bool:
        return bool(self.members)

    def owner(self, block_hash: int) -> str | None:
        if not self._points:
            return None
        i = bisect.bisect_left(self._points, block_hash)
        return self._owners[i % len(self._owners)]

    def group(self, block_hashes: Iterable[int]) -> dict[str, list[int]]:
        """Block hashes by owner, each list in the order given."""
        groups: dict[str, list[int]] = {}
        for block_hash in block_hashes:
            owner = self.owner(block_hash)
            if owner is not None:
                groups.setdefault(owner, []).append(block_hash)
        return groups
