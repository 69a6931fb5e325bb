"""Why a request's first token took as long as it did: TTFT split into the stages each
service measured on its own clock (durations only: clocks of different processes are
never compared), the rest being the hops between them.

In kvstack the first token comes from the prefill worker once the decode worker holds
the prompt's KV, so the KV transfer is part of TTFT; the decode worker's queue and first
step come after it (`decode_first_token`, the wait for the second token).
"""

from __future__ import annotations

from shared.messages import PrefillTiming

# The stages of TTFT, in order (also the `stage` label of the gateway's histogram).
TTFT_STAGES = (
    "conductor",  # the gateway asking where to run it (the conductor's queue included)
    "decode_reserve",  # the decode worker reserving blocks for the KV
    "prefix_plan",  # the prefill worker binding the prompt's prefix (lookups, fetch start)
    "prefill_queue",  # in the prefill worker's queue and its engine's, before the first step
    "prefill_compute",  # its first prefill step to its first token
    "kv_transfer",  # the KV stream's end until the decode worker adopted it
    "network",  # the rest: messages between services, the gateway's own work
)


def ttft_breakdown(
    ttft: float,
    placement: float | None,
    prefill: PrefillTiming | None,
    decode_wait: float,
) -> dict:
    """The timing a response carries (`usage.timing`), in seconds and tokens."""
    prefill = prefill or PrefillTiming()
    stages = {
        "conductor": placement or 0.0,
        "decode_reserve": prefill.reserve,
        "prefix_plan": prefill.prefix,
        "prefill_queue": prefill.queue,
        "prefill_compute": prefill.compute,
        "kv_transfer": prefill.transfer,
    }
    stages["network"] = max(0.0, ttft - sum(stages.values()))
    cached = {
        "local": prefill.cached_local,
        "kvstore": prefill.cached_kvstore,
        "peer": prefill.cached_peer,
    }
    return {
        "ttft": ttft,
        **{name: round(seconds, 6) for name, seconds in stages.items()},
        "decode_first_token": decode_wait,
        "cached_tokens": cached,
        "prefix_load": prefix_load(prefill),
        # NOTE: streamed layer by layer while it computes: its cost shows in prefill_compute
        "kv_handoff": {"bytes": prefill.handoff_bytes, "held_by_decode": prefill.held_decode},
    }


def prefix_load(prefill: PrefillTiming) -> dict:
    """The fetched prefix (from the pool or a peer): its bytes, seconds and GB/s."""
    seconds = prefill.prefix_load
    rate = prefill.prefix_bytes / seconds / 1e9 if seconds > 0 else 0.0
    return {"bytes": prefill.prefix_bytes, "seconds": round(seconds, 6), "gb_s": round(rate, 3)}


def measured_parts(ttft: float, prefill: PrefillTiming | None) -> tuple[float, float]:
    """The parts of a TTFT the conductor estimates, as measured (-1: not measured): the wait
    before the prefill's first step (everything before it, hops included, as the
    simulator counts it), and that prefill's compute, only when no prefix was loaded into
    it (loads overlap the compute: then it is not what the prefill estimate predicts)."""
    if prefill is None:
        return -1.0, -1.0
    queue = max(0.0, ttft - prefill.compute - prefill.transfer)
    loaded = prefill.cached_kvstore + prefill.cached_peer
    return queue, -1.0 if loaded else prefill.compute
