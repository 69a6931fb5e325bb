"""Placement policies: pure functions of a cluster snapshot and a request.

The live conductor and the simulator call the same functions, so what a simulation
shows is what the cluster does.
"""
from __future__ import annotations

import itertools

from shared.messages import Placement, PlacementRequest
from services.conductor.snapshot import NO_MATCH, ClusterSnapshot, PrefixMatch, WorkerLoad

RETRY_AFTER_NO_WORKERS = 2.0


def load_balance(snapshot: ClusterSnapshot, request: PlacementRequest,
                 prefix: PrefixMatch = NO_MATCH) -> Placement:
    """Least queued prefill work; the decode worker with the most free KV blocks."""
    return _place(snapshot, request, prefix,
                  lambda ws: min(ws, key=lambda w: (w.queued_tokens, w.num_waiting, w.worker_id)))


_turns = itertools.count()


def round_robin(snapshot: ClusterSnapshot, request: PlacementRequest,
                prefix: PrefixMatch = NO_MATCH) -> Placement:
    """Prefill workers in turn (by id), whatever their load or cache."""
    return _place(snapshot, request, prefix,
                  lambda ws: sorted(ws, key=lambda w: w.worker_id)[next(_turns) % len(ws)])


POLICIES = {"load-balance": load_balance, "round-robin": round_robin}


def _place(snapshot: ClusterSnapshot, request: PlacementRequest, prefix: PrefixMatch,
           choose_prefill) -> Placement:
    prefill = _candidates(snapshot.prefill, request)
    decode = [w for w in _candidates(snapshot.decode, request) if _fits(w, request)]
    if not prefill or not decode:
        missing = "prefill" if not prefill else "decode"
        return Placement(request.request_id, False, reason=f"no {missing} worker available",
                         retry_after=RETRY_AFTER_NO_WORKERS)
    chosen = choose_prefill(prefill)
    chosen_decode = max(decode, key=lambda w: (w.free_blocks, -w.num_running, w.worker_id))
    peer, peer_blocks = _peer_hint(chosen.worker_id, prefix)
    return Placement(request.request_id, True, chosen.worker_id, chosen_decode.worker_id,
                     prefix_peer=peer, prefix_peer_blocks=peer_blocks)


def _peer_hint(prefill_id: str, prefix: PrefixMatch) -> tuple[str, int]:
    """A peer prefill worker to load the prefix from, when it holds more than both the
    chosen worker's own cache and the kvstore pool."""
    peer, blocks = prefix.best_peer(prefill_id)
    if blocks > max(prefix.local(prefill_id), prefix.pool_blocks):
        return peer, blocks
    return "", 0


def _candidates(workers: tuple[WorkerLoad, ...], request: PlacementRequest) -> list[WorkerLoad]:
    return [w for w in workers if w.worker_id not in request.exclude]


def _fits(worker: WorkerLoad, request: PlacementRequest) -> bool:
    """Whether the prompt's KV (and its first token) fits the decode worker's pool at all."""
    needed = -(-(request.num_prompt_tokens + 1) // max(worker.block_size, 1))
    return needed <= worker.total_blocks
