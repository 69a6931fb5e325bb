"""The cluster as a placement policy sees it: plain, frozen data, no I/O. The workers'
loads are in loads.py; what policies derive from them, in views.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from shared.conductor.loads import WorkerLoad
from shared.conductor.views import DecodeView, LoadViews, PrefillView

POOL = "kvstore"


class Remote(NamedTuple):
    """Where a prefix could be loaded from (a peer prefill worker, or the pool: POOL), and
    how many leading blocks of the prompt it holds ("", 0: nowhere)."""

    source: str
    blocks: int


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """How much of one request's prompt (in leading blocks) is cached where."""

    by_worker: dict[str, int]  # prefill worker -> leading blocks in its local cache (a
    # worker that holds none may be left out), or there before a prompt placed now starts
    pool_blocks: int = 0  # leading blocks in the kvstore pool
    # prefill worker -> leading blocks it can send a peer now; None: by_worker's (they differ
    # by blocks still on their way into a worker's cache: inflight.py)
    senders: dict[str, int] | None = None
    # NOTE: found on the first ask and kept: every prefill worker asks, so a decision groups
    # and ranks the workers once, not once per worker.
    _holders: dict[int, list[str]] | None = field(
        default=None, init=False, repr=False, compare=False
    )
    _top: tuple[tuple[int, str], ...] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def local(self, worker_id: str) -> int:
        return self.by_worker.get(worker_id, 0)

    def holders(self) -> dict[int, list[str]]:
        """The workers that hold some of the prompt, by how many leading blocks."""
        if self._holders is None:
            holders = _by_blocks(self.by_worker)
            object.__setattr__(self, "_holders", holders)
            return holders
        return self._holders

    def sender_blocks(self) -> dict[str, int]:
        """Leading blocks each worker can send a peer now."""
        return self.by_worker if self.senders is None else self.senders

    def best_peer(self, exclude: str) -> Remote:
        """The other prefill worker with the longest match (ties: lowest id)."""
        for neg_blocks, worker in self._ranked():
            if worker != exclude:
                return Remote(worker, -neg_blocks)
        return Remote("", 0)

    def best_remote(self, worker_id: str) -> Remote:
        """Where `worker_id` could load the longest prefix from: a peer when it holds more
        than the kvstore pool, else the pool ("kvstore"). `worker_id` "": from anywhere."""
        return self._or_pool(*self.best_peer(worker_id))

    def _ranked(self) -> tuple[tuple[int, str], ...]:
        """The two longest matches as (-blocks, worker), ties by lowest id."""
        if self._top is None:
            held = self.holders() if self.senders is None else _by_blocks(self.senders)
            top = _two_longest(held)
            object.__setattr__(self, "_top", top)
            return top
        return self._top

    def _or_pool(self, peer: str, blocks: int) -> Remote:
        return Remote(peer, blocks) if blocks > self.pool_blocks else Remote(POOL, self.pool_blocks)


def _by_blocks(by_worker: dict[str, int]) -> dict[int, list[str]]:
    holders: dict[int, list[str]] = {}
    for worker, blocks in by_worker.items():
        if blocks > 0:
            holders.setdefault(blocks, []).append(worker)
    return holders


def _two_longest(holders: dict[int, list[str]]) -> tuple[tuple[int, str], ...]:
    """sorted((-blocks, worker) of every holder)[:2], without sorting them all."""
    top: list[tuple[int, str]] = []
    for blocks in sorted(holders, reverse=True):
        first = min(holders[blocks])
        top.append((-blocks, first))
        if len(top) == 2:
            break
        if len(holders[blocks]) > 1:
            top.append((-blocks, min(w for w in holders[blocks] if w != first)))
            break
    return tuple(top)


NO_MATCH = PrefixMatch({})


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    time: float
    prefill: tuple[WorkerLoad, ...]
    decode: tuple[WorkerLoad, ...]
    # what policies derive from the loads, shared by a cluster state's snapshots (views.py)
    views: LoadViews = field(default_factory=LoadViews, repr=False, compare=False)

    def prefill_view(self) -> PrefillView:
        return self.views.prefill(self.prefill)

    def decode_view(self) -> DecodeView:
        return self.views.decode(self.decode)
