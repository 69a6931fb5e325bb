"""Placement policies: pure functions of a cluster snapshot and a request.

The live conductor and the simulator call the same functions, so what a simulation
shows is what the cluster does.
"""
from __future__ import annotations

from shared.messages import Placement, PlacementRequest
from services.conductor.snapshot import ClusterSnapshot, WorkerLoad

RETRY_AFTER_NO_WORKERS = 2.0


def load_balance(snapshot: ClusterSnapshot, request: PlacementRequest) -> Placement:
    """Least queued prefill work; the decode worker with the most free KV blocks."""
    prefill = _candidates(snapshot.prefill, request)
    decode = [w for w in _candidates(snapshot.decode, request) if _fits(w, request)]
    if not prefill or not decode:
        missing = "prefill" if not prefill else "decode"
        return Placement(request.request_id, False, reason=f"no {missing} worker available",
                         retry_after=RETRY_AFTER_NO_WORKERS)
    chosen_prefill = min(prefill, key=lambda w: (w.queued_tokens, w.num_waiting, w.worker_id))
    chosen_decode = max(decode, key=lambda w: (w.free_blocks, -w.num_running, w.worker_id))
    return Placement(request.request_id, True, chosen_prefill.worker_id, chosen_decode.worker_id)


POLICIES = {"load-balance": load_balance}


def _candidates(workers: tuple[WorkerLoad, ...], request: PlacementRequest) -> list[WorkerLoad]:
    return [w for w in workers if w.worker_id not in request.exclude]


def _fits(worker: WorkerLoad, request: PlacementRequest) -> bool:
    """Whether the prompt's KV (and its first token) fits the decode worker's pool at all."""
    needed = -(-(request.num_prompt_tokens + 1) // max(worker.block_size, 1))
    return needed <= worker.total_blocks
