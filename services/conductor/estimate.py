"""Predicted times of one placement, from a cost model and a worker's load: what the
kvcentric policy minimises and what admission compares with the SLOs."""
from __future__ import annotations

import numpy as np

from services.conductor.snapshot import WorkerLoad
from shared.costmodel import CostModel


def prefill_queue_time(worker: WorkerLoad, cost: CostModel) -> float:
    """Seconds of prefill already queued on `worker`: its reported queue, taken as requests
    of equal length, plus the predicted seconds assigned since its last beat. Remembered on
    `worker` for `cost` (a cost model's answers never change)."""
    known = worker._queue_time
    if known is not None and known[0] is cost:
        return known[1]
    requests, tokens = worker.reported_waiting
    queued = requests * cost.prefill_time(tokens // requests, 0) if requests and tokens else 0.0
    seconds = queued + worker.pending.seconds
    object.__setattr__(worker, "_queue_time", (cost, seconds))
    return seconds


def prefill_time(cost: CostModel, num_prompt_tokens: int, num_prefix_tokens: int) -> float:
    """Seconds to compute the prompt after its first `num_prefix_tokens` (one token always
    computes, for the first output token)."""
    cached = min(num_prefix_tokens, num_prompt_tokens - 1)
    return cost.prefill_time(num_prompt_tokens - cached, cached)


def transfer_time(cost: CostModel, num_blocks: int, block_size: int) -> float:
    return cost.transfer_time(num_blocks * block_size * cost.kv_bytes_per_token) \
        if num_blocks else 0.0


def decode_tbt(worker: WorkerLoad, num_prompt_tokens: int, cost: CostModel) -> float:
    """Seconds per token on `worker` once this request joins its batch."""
    batch = worker.num_running + worker.num_waiting + 1
    return cost.decode_step_time(batch, worker.context_tokens + num_prompt_tokens)


def decode_tbts(workers: list[WorkerLoad], num_prompt_tokens: int, cost: CostModel
                ) -> list[float]:
    """decode_tbt of each worker, in one vectorized call where the cost model has one (a
    conductor weighs every decode worker on every placement)."""
    vectorized = getattr(cost, "decode_step_times", None)
    if vectorized is None:
        return [decode_tbt(w, num_prompt_tokens, cost) for w in workers]
    count = len(workers)
    batch = np.fromiter((w.num_running + w.num_waiting + 1 for w in workers), float, count)
    context = np.fromiter((w.context_tokens + num_prompt_tokens for w in workers), float,
                          count)
    return vectorized(batch, context).tolist()
