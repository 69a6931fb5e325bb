"""Where each KV block lives, kept from KV events: the block hashes each worker holds.

Block hashes chain (shared/hashing.py): a hash names its whole prefix, so a cache that
holds a block of a prompt holds, as a rule, every block before it, and what a worker holds
of a prompt is a run of its leading blocks. `match` relies on that: only the workers that
hold the prompt's first block can match at all, and where each one's run ends is found by
a binary search over the prompt's hashes, O(log n) set lookups per worker, whatever the
size of the index. The kvstore pool (every "kvstore" instance together) is searched the
same way.

NOTE: a hole in a worker's run (a middle block evicted on its own) makes its match end at
the hole or at a later edge between a held and a missing block: an overestimate, never an
underestimate. Prefill workers check their prefix themselves, so a wrong estimate costs
time (a worse placement, recomputed blocks), never correctness. `walk` is the exact match,
block by block, kept as the reference for tests and the benchmark's baseline.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from shared.conductor.snapshot import PrefixMatch
from shared.messages import KVEvent

POOL = "kvstore"


class PrefixIndex:
    def __init__(self) -> None:
        self._blocks: dict[str, set[int]] = {}  # worker id -> block hashes it holds
        self._service: dict[str, str] = {}  # worker id -> service
        self._holders: dict[int, int] = {}  # block hash -> how many workers hold it
        self._pool: dict[int, int] = {}  # ... how many kvstore instances hold it
        # the workers last matched and their sets, until a worker's set comes or goes
        self._sets: tuple[Sequence[str], list[set[int] | None]] | None = None

    def __len__(self) -> int:
        return len(self._holders)

    @property
    def num_pooled(self) -> int:
        """How many distinct blocks some kvstore holds."""
        return len(self._pool)

    def apply(self, event: KVEvent) -> None:
        self._service[event.source] = event.service
        if event.source not in self._blocks:
            self._sets = None
        blocks = self._blocks.setdefault(event.source, set())
        counts = (self._holders, self._pool) if event.service == POOL else (self._holders,)
        for block_hash in event.stored:
            if block_hash not in blocks:
                blocks.add(block_hash)
                for count in counts:
                    count[block_hash] = count.get(block_hash, 0) + 1
        for block_hash in event.removed:
            if block_hash in blocks:
                blocks.remove(block_hash)
                for count in counts:
                    _decrement(count, block_hash)

    def forget(self, worker_id: str) -> None:
        """A dead worker's blocks leave the index."""
        pooled = self._service.pop(worker_id, None) == POOL
        self._sets = None
        for block_hash in self._blocks.pop(worker_id, ()):
            _decrement(self._holders, block_hash)
            if pooled:
                _decrement(self._pool, block_hash)

    def match(self, block_hashes: Sequence[int], workers: Sequence[str]) -> PrefixMatch:
        """Leading blocks cached on each of `workers` that holds any (the others are left
        out), and in the kvstore pool as a whole, each taken to be a run from the first
        block (see the module's NOTE)."""
        by_worker: dict[str, int] = {}
        ends: list[int] = []
        first = block_hashes[0] if block_hashes else None
        if first in self._holders:
            for worker, held in zip(workers, self._sets_of(workers)):
                if held and first in held:
                    by_worker[worker] = _leading_run(block_hashes, held, ends)
        pool = _leading_run(block_hashes, self._pool, ends) if first in self._pool else 0
        return PrefixMatch(by_worker, pool)

    def walk(self, block_hashes: Sequence[int], workers: Sequence[str]) -> PrefixMatch:
        """The exact match: blocks up to each worker's (and the pool's) first miss."""
        runs = {w: _leading(block_hashes, self._blocks.get(w, ())) for w in workers}
        return PrefixMatch({w: n for w, n in runs.items() if n}, _leading(block_hashes, self._pool))

    def _sets_of(self, workers: Sequence[str]) -> list[set[int] | None]:
        """Each worker's blocks, kept while the same workers (a snapshot's ids, which stay
        the same object from decision to decision) are asked about."""
        if self._sets is None or self._sets[0] is not workers:
            self._sets = (workers, [self._blocks.get(w) for w in workers])
        return self._sets[1]


def _leading_run(hashes: Sequence[int], held: Collection[int], ends: list[int]) -> int:
    """How many leading `hashes` are in `held`, when those in it are a leading run.

    A binary search that probes first where the runs of other caches ended (`ends`, sorted;
    the answer joins them): the holders of a shared prefix mostly end together, so most
    searches take a probe or two, and none more than log2 of each list's length plus one.
    """
    if len(ends) == 1:  # NOTE: the common case, probed as the search would
        end = ends[0]
        if hashes[end - 1] in held and (end == len(hashes) or hashes[end] not in held):
            return end
    lo, hi = 0, len(hashes)  # hashes[:lo] are held, hashes[hi:] are not
    i, j = 0, len(ends)
    while i < j:
        k = (i + j) // 2
        if hashes[ends[k] - 1] in held:
            lo, i = ends[k], k + 1
        else:
            hi, j = ends[k] - 1, k
    known = lo  # 0, or ends[i - 1]; and hi < ends[i]
    if 0 < lo < hi:  # most likely ends where another run did
        if hashes[lo] in held:
            lo += 1
        else:
            hi = lo
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if hashes[mid - 1] in held:
            lo = mid
        else:
            hi = mid - 1
    if lo != known:  # a new end, between ends[i - 1] and ends[i]
        ends.insert(i, lo)
    return lo


def _leading(hashes: Sequence[int], held: Collection[int]) -> int:
    for i, block_hash in enumerate(hashes):
        if block_hash not in held:
            return i
    return len(hashes)


def _decrement(count: dict[int, int], block_hash: int) -> None:
    left = count.pop(block_hash, 0) - 1
    if left > 0:
        count[block_hash] = left
