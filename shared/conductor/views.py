"""What policies derive from a snapshot's workers on every placement: prefill queue times
ranked, decode loads as columns for one vectorized TBT prediction.

A cluster state hands every snapshot the same LoadViews, and between two decisions only a
worker or two changes (a heartbeat, an assignment), so a view recomputes only those. The
state says which ones (`advance`); for any other snapshot, a view compares its loads with
the ones it last saw by identity (the state reuses the WorkerLoad of a worker that did not
change). Answers are those of computing afresh; a view is valid until the next call that
syncs it.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Iterable
from itertools import compress

import numpy as np

from shared.conductor import estimate
from shared.conductor.loads import WorkerLoad
from shared.costmodel import CostModel

REBUILD_SHARE = 4  # more than 1/4 of the workers changed: recompute all, not row by row


class LoadViews:
    """One PrefillView and one DecodeView, kept in step with the snapshots asked about."""

    def __init__(self) -> None:
        self._views = {"prefill": PrefillView(), "decode": DecodeView()}

    def prefill(self, loads: tuple[WorkerLoad, ...]) -> PrefillView:
        return self._synced("prefill", loads)

    def decode(self, loads: tuple[WorkerLoad, ...]) -> DecodeView:
        return self._synced("decode", loads)

    def advance(
        self,
        service: str,
        before: tuple[WorkerLoad, ...],
        after: tuple[WorkerLoad, ...],
        changed: Iterable[WorkerLoad],
    ) -> None:
        """`after` holds the loads of `before` but for the `changed` ones: a view synced to
        `before` takes just those (one that is not finds out when asked)."""
        view = self._views[service]
        if view.loads is before and len(after) == len(before):
            view.loads = after
            for load in changed:
                view.replace(load)

    def _synced(self, service: str, loads: tuple[WorkerLoad, ...]):
        view = self._views[service]
        view.sync(loads)
        return view


class SyncedView:
    """Derived values of each worker, for the loads last synced (in snapshot order)."""

    def __init__(self) -> None:
        self.loads: tuple[WorkerLoad, ...] = ()
        self.ids: tuple[str, ...] = ()

    def sync(self, loads: tuple[WorkerLoad, ...]) -> None:
        if loads is self.loads:
            return
        changed = self._changed(loads)
        self.loads = loads
        if changed is None:
            self.ids = tuple(w.worker_id for w in loads)
            self.rebuild()
        else:
            for load in changed:
                self.replace(load)

    def _changed(self, loads: tuple[WorkerLoad, ...]) -> list[WorkerLoad] | None:
        """The loads that differ from the last ones; None when the workers themselves
        differ (or too many changed to be worth it one by one)."""
        if len(loads) != len(self.loads):
            return None
        changed = list(compress(range(len(loads)), map(operator.is_not, loads, self.loads)))
        if len(changed) * REBUILD_SHARE > len(loads) or any(
            loads[i].worker_id != self.ids[i] for i in changed
        ):
            return None
        return [loads[i] for i in changed]

    def rebuild(self) -> None:
        raise NotImplementedError

    def replace(self, load: WorkerLoad) -> None:
        """Take a worker's new load."""
        raise NotImplementedError


class PrefillView(SyncedView):
    """Prefill workers by id, their block size and, for one cost model at a time, their
    queue seconds (estimate.prefill_queue_time) and their ranking by (queue seconds, id)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_id: dict[str, WorkerLoad] = {}
        self.block_size: int | None = None  # every worker's, or None when they differ
        self._cost: CostModel | None = None
        self._queue: dict[str, float] = {}
        self._ranking: list[tuple[float, str]] = []
        # worker id -> (requests, tokens) it reported queued, and their seconds: kept
        # until its next beat (an assignment changes only what is pending)
        self._reported: dict[str, tuple[tuple[int, int], float]] = {}

    def block_sizes(self) -> list[int]:
        """The workers' block sizes, each once, smallest first."""
        if self.block_size is not None:
            return [self.block_size]
        return sorted({w.block_size for w in self.loads})

    def queue_seconds(self, cost: CostModel) -> dict[str, float]:
        self._rank(cost)
        return self._queue

    def ranking(self, cost: CostModel) -> list[tuple[float, str]]:
        self._rank(cost)
        return self._ranking

    def _rank(self, cost: CostModel) -> None:
        if cost is self._cost:
            return
        self._cost, self._reported = cost, {}
        self._queue = {w.worker_id: self._queue_time(w, cost) for w in self.loads}
        self._ranking = sorted((s, w) for w, s in self._queue.items())

    def rebuild(self) -> None:
        self.by_id = {w.worker_id: w for w in self.loads}
        sizes = {w.block_size for w in self.loads}
        self.block_size = sizes.pop() if len(sizes) == 1 else None
        self._cost = None  # ranked again on the next ask

    def replace(self, load: WorkerLoad) -> None:
        worker_id = load.worker_id
        self.by_id[worker_id] = load
        if load.block_size != self.block_size:
            self.block_size = None
        if self._cost is None:
            return
        del self._ranking[bisect.bisect_left(self._ranking, (self._queue[worker_id], worker_id))]
        seconds = self._queue[worker_id] = self._queue_time(load, self._cost)
        bisect.insort(self._ranking, (seconds, worker_id))

    def _queue_time(self, load: WorkerLoad, cost: CostModel) -> float:
        """estimate.prefill_queue_time, its reported part remembered."""
        waiting, known = load.reported_queue, self._reported.get(load.worker_id)
        if known is None or known[0] != waiting:
            known = self._reported[load.worker_id] = (
                waiting,
                estimate.reported_queue_time(*waiting, cost),
            )
        return known[1] + load.pending.seconds


class DecodeView(SyncedView):
    """Decode workers as columns, one row a worker in order of id (so the first of equal
    values is the lowest id's): the batch a new request would join, context tokens, and
    tokens of KV free now and in all."""

    def __init__(self) -> None:
        super().__init__()
        self.row: dict[str, int] = {}  # worker id -> row
        self.by_row: list[WorkerLoad] = []
        self.rows = np.zeros(0, dtype=np.intp)  # every row
        self.batch = np.zeros(0)  # running + waiting + the new request
        self.context = np.zeros(0)
        self.free_tokens = np.zeros(0, dtype=np.int64)
        self.total_tokens = np.zeros(0, dtype=np.int64)
        self._least: dict[str, int] = {}  # column -> its least value, where known

    def tbts(self, rows: np.ndarray, num_prompt_tokens: int, cost: CostModel) -> np.ndarray:
        """estimate.decode_tbt of the workers at `rows`, in one vectorized call where the
        cost model has one (a conductor weighs every decode worker on every placement)."""
        vectorized = getattr(cost, "decode_step_times", None)
        if vectorized is None:
            return np.array(
                [
                    estimate.decode_tbt(self.by_row[i], num_prompt_tokens, cost)
                    for i in rows.tolist()
                ]
            )
        if rows is self.rows:  # all of them: the columns as they are
            return vectorized(self.batch, self.context + num_prompt_tokens)
        return vectorized(self.batch[rows], self.context[rows] + num_prompt_tokens)

    def least_free_tokens(self) -> int:
        return self._least_of("free_tokens")

    def least_total_tokens(self) -> int:
        return self._least_of("total_tokens")

    def _least_of(self, column: str) -> int:
        least = self._least.get(column)
        if least is None:
            values = getattr(self, column)
            least = self._least[column] = int(values.min()) if len(values) else 0
        return least

    def rebuild(self) -> None:
        loads = self.by_row = sorted(self.loads, key=lambda w: w.worker_id)
        count = len(loads)
        self.row = {w.worker_id: i for i, w in enumerate(loads)}
        self.rows = np.arange(count)
        self.batch = np.fromiter((w.num_running + w.num_waiting + 1 for w in loads), float, count)
        self.context = np.fromiter((w.context_tokens for w in loads), float, count)
        self.free_tokens = np.fromiter(
            (w.free_blocks * w.block_size for w in loads), np.int64, count
        )
        self.total_tokens = np.fromiter(
            (w.total_blocks * w.block_size for w in loads), np.int64, count
        )
        self._least = {}

    def replace(self, load: WorkerLoad) -> None:
        i = self.row[load.worker_id]
        old, self.by_row[i] = self.by_row[i], load
        self.batch[i] = load.num_running + load.num_waiting + 1
        self.context[i] = load.context_tokens
        self.free_tokens[i] = free = load.free_blocks * load.block_size
        self.total_tokens[i] = total = load.total_blocks * load.block_size
        self._keep_least("free_tokens", old.free_blocks * old.block_size, free)
        self._keep_least("total_tokens", old.total_blocks * old.block_size, total)

    def _keep_least(self, column: str, old: int, new: int) -> None:
        """Keep a column's least known when a row goes from `old` to `new`, unless the row
        held it and grows (then it is found again when asked): a decision changes a
        worker's free tokens, rarely its total."""
        least = self._least.get(column)
        if least is None or old == new:
            return
        if new <= least:
            self._least[column] = new
        elif old == least:
            del self._least[column]
