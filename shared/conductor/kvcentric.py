"""Mooncake's Algorithm 1, KVCache-centric scheduling, as the paper states it (arXiv
2407.00079 §6 and Algorithm 1; FAST'25 §4), written worker by worker.

This module is the statement of what the `kvcentric` and `cache-aware` policies decide.
The policies themselves (policies.py) decide exactly the same, faster: they weigh the
workers that would take the same route together. tests/shared/conductor/test_kvcentric.py
checks on generated clusters that the two agree.

The paper's steps, and where each one happens in kvstack:

1. `block_keys = PrefixHash(prompt, B)`: the gateway hashes the prompt
   (shared/hashing.py); the request carries the hashes.
2. `best_TTFT = inf`.
3. `FindBestPrefixMatch(P, block_keys)`: the prefix index (index.py) finds how many
   leading blocks each prefill worker and the kvstore pool hold: `inputs.prefix`.
4. For every prefill worker, `TTFT = T_transfer + T_queue + T_prefill`, the least wins
   (`_plan`).
5. `SelectDecodingInstance(D)`: the decode worker with the least predicted TBT
   (`_decode_worker`).
6. Reject when `TTFT > TTFT_SLO` or `TBT > TBT_SLO` (`over_slo`). The conductor does this
   in admission.py (the `early` mode; the other modes judge the decode load otherwise).
7. `TransferKVCache(best_instance, p)`: the choice names the source (`fetch_from`) and
   its blocks; the prefill worker pulls them and keeps a replica.
8. The conductor counts the request on p's queue until p reports it (core.py).

Where the paper leaves a detail open, kvstack reads it so:

- `best_len` is the longest match on *another* prefill worker (ties: the lowest id) or
  in the kvstore pool, the pool when it holds as much (it computes nothing).
- `best_len / local_len` with `local_len = 0` counts as infinite, but only a longer
  prefix than the local one is ever fetched.
- `T_queue` is what the worker reported queued plus what the conductor sent it since,
  and every TTFT includes the cost model's per-request overhead.
- A worker that fetches nothing loads what it finds of the prompt when no longer prefix
  is known elsewhere (the index may lag its writes), and recomputes it when it turns a
  longer one down (`load_prefix`).
- Below the balancing threshold the paper recomputes the blocks a longer remote prefix
  holds; kvstack loads them when the cost model says loading and computing the rest is
  faster than computing it all (`_loading_is_faster`): recomputing spent prefill capacity
  on work a transfer does for less, and under load that cost the requests queued behind
  (docs/experiments.md, the sweep).
- `cache-aware` is the same loop with every worker in the "cache-aware only" branch: its
  own prefix, nothing fetched, nothing loaded beyond it.
"""

from __future__ import annotations

from shared.conductor import estimate
from shared.conductor.admission import slo_of
from shared.conductor.loads import WorkerLoad
from shared.conductor.policies import Choice, Inputs, Rejection
from shared.conductor.snapshot import POOL, PrefixMatch
from shared.errors import no_worker


def kvcentric(inputs: Inputs) -> Choice | Rejection:
    """Algorithm 1, steps 2-5: where to prefill and where to decode the request."""
    return _schedule(inputs, balancing=True)


def cache_aware(inputs: Inputs) -> Choice | Rejection:
    """Algorithm 1 with no cache balancing: each worker counts only its own prefix."""
    return _schedule(inputs, balancing=False)


def over_slo(inputs: Inputs, choice: Choice) -> bool:
    """Algorithm 1, step 6: the request would miss its TTFT or TBT SLO (reject it)."""
    slo = slo_of(inputs.request, inputs.config)
    return choice.ttft > slo.ttft or choice.tbt > slo.tbt


def _schedule(inputs: Inputs, balancing: bool) -> Choice | Rejection:
    request, n = inputs.request, inputs.request.num_prompt_tokens
    prefill = [w for w in inputs.snapshot.prefill if w.worker_id not in request.exclude]
    decode = [
        w
        for w in inputs.snapshot.decode
        if w.worker_id not in request.exclude and n + 1 <= w.total_blocks * w.block_size
    ]
    if not prefill or not decode:
        missing = "prefill" if not prefill else "decode"
        return Rejection(no_worker(missing), inputs.config.retry_after)
    plans = [_plan(inputs, worker, balancing) for worker in prefill]
    best = min(plans, key=lambda plan: (plan.ttft, plan.prefill_id))
    chosen = _decode_worker(inputs, decode)
    return best._replace(
        decode_id=chosen.worker_id, tbt=estimate.decode_tbt(chosen, n, inputs.cost)
    )


def _plan(inputs: Inputs, worker: WorkerLoad, balancing: bool) -> Choice:
    """Algorithm 1, step 4, for one prefill worker: its predicted TTFT and how it gets
    the prompt's prefix."""
    cost, n = inputs.cost, inputs.request.num_prompt_tokens
    local_len = inputs.prefix.local(worker.worker_id)
    best_instance, best_len = _best_remote(inputs.prefix, worker.worker_id)
    threshold = inputs.config.balancing_threshold  # the paper's kvcache_balancing_threshold
    longer = best_len > local_len
    if balancing and longer and (local_len == 0 or best_len / local_len > threshold):
        # cache-aware and balancing: fetch the best prefix, keep a replica
        source, source_len, load_prefix = best_instance, best_len, True
    elif balancing and longer and _loading_is_faster(inputs, worker, local_len, best_len):
        # below the threshold, but loading beats recomputing (kvstack's addition)
        source, source_len, load_prefix = best_instance, best_len, True
    else:  # cache-aware only: the local prefix; the rest is computed
        source, source_len, load_prefix = "", 0, balancing and not longer
    fetch_blocks = max(0, source_len - local_len)
    prefix_tokens = min(max(local_len, source_len) * worker.block_size, n - 1)
    t_transfer = estimate.transfer_time(cost, fetch_blocks, worker.block_size)
    t_queue = estimate.prefill_queue_time(worker, cost)
    t_prefill = estimate.prefill_time(cost, n, prefix_tokens)
    overhead = getattr(cost, "request_overhead", 0.0)
    # NOTE: summed in this order, as policies.py sums it (float addition is not associative)
    ttft = (overhead + t_queue) + (t_transfer + t_prefill)
    return Choice(
        prefill_id=worker.worker_id,
        decode_id="",
        ttft=ttft,
        tbt=0.0,
        prefix_tokens=prefix_tokens,
        fetch_from=source,
        fetch_blocks=fetch_blocks,
        source_blocks=source_len,
        load_prefix=load_prefix,
        busy_seconds=t_transfer + t_prefill,
        transfer_seconds=t_transfer,
    )


def _loading_is_faster(inputs: Inputs, worker: WorkerLoad, local_len: int, best_len: int) -> bool:
    """Whether loading the prompt's prefix up to `best_len` blocks and computing the rest
    takes less time than computing all past the worker's `local_len` blocks."""
    cost, n, block = inputs.cost, inputs.request.num_prompt_tokens, worker.block_size
    fetch = estimate.transfer_time(cost, best_len - local_len, block)
    loaded = estimate.prefill_time(cost, n, min(best_len * block, n - 1))
    computed = estimate.prefill_time(cost, n, min(local_len * block, n - 1))
    return fetch + loaded < computed


def _best_remote(prefix: PrefixMatch, worker_id: str) -> tuple[str, int]:
    """FindBestPrefixMatch, seen from `worker_id`: (where, leading blocks) of the longest
    prefix held elsewhere."""
    senders = prefix.sender_blocks()
    others = {w: blocks for w, blocks in senders.items() if w != worker_id and blocks}
    best_len = max(others.values(), default=0)
    if best_len <= prefix.pool_blocks:
        return POOL, prefix.pool_blocks
    return min(w for w, blocks in others.items() if blocks == best_len), best_len


def _decode_worker(inputs: Inputs, fitting: list[WorkerLoad]) -> WorkerLoad:
    """Algorithm 1, step 5: of the decode workers whose KV pool can hold the prompt, the
    least predicted TBT (ties: the lowest id), among those with room for it now if any."""
    n, cost = inputs.request.num_prompt_tokens, inputs.cost
    roomy = [w for w in fitting if n + 1 <= w.free_blocks * w.block_size] or fitting
    return min(roomy, key=lambda w: (estimate.decode_tbt(w, n, cost), w.worker_id))
