"""Predicted times of one placement, from a cost model and a worker's load: what the
kvcentric policy minimises and what admission compares with the SLOs."""

from __future__ import annotations

from shared.conductor.loads import WorkerLoad
from shared.costmodel import CostModel


def prefill_queue_time(worker: WorkerLoad, cost: CostModel) -> float:
    """Seconds of prefill already queued on `worker`: its reported queue plus the
    predicted seconds assigned since its last beat."""
    return reported_queue_time(*worker.reported_queue, cost) + worker.pending.seconds


def reported_queue_time(requests: int, tokens: int, cost: CostModel) -> float:
    """Seconds of `requests` queued prefills of `tokens` in all, taken as of equal length."""
    return requests * cost.prefill_time(tokens // requests, 0) if requests and tokens else 0.0


def prefill_time(cost: CostModel, num_prompt_tokens: int, num_prefix_tokens: int) -> float:
    """Seconds to compute the prompt after its first `num_prefix_tokens` (one token always
    computes, for the first output token)."""
    cached = min(num_prefix_tokens, num_prompt_tokens - 1)
    return cost.prefill_time(num_prompt_tokens - cached, cached)


def transfer_time(cost: CostModel, num_blocks: int, block_size: int) -> float:
    return (
        cost.transfer_time(num_blocks * block_size * cost.kv_bytes_per_token) if num_blocks else 0.0
    )


def decode_tbt(worker: WorkerLoad, num_prompt_tokens: int, cost: CostModel) -> float:
    """Seconds per token on `worker` once this request joins its batch."""
    batch = worker.num_running + worker.num_waiting + 1
    return cost.decode_step_time(batch, worker.context_tokens + num_prompt_tokens)
