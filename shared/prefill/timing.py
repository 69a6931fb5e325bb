"""A prefill worker's account of a request's time before its first token: the moments it
marked, turned into the stages of `PrefillTiming`. Pure: the service marks the moments."""

from __future__ import annotations

from shared.messages import PrefillTiming
from shared.prefill.prefix import NO_PREFIX, PrefixPlan, source_kind

# The moments, in order; a stage lasts from one to the next. ADMITTED: the worker's
# queue let the prompt in (services/prefill/admission.py); it binds its prefix then.
RECEIVED, RESERVED, ADMITTED, PLANNED, COMPUTING, COMPUTED, ADOPTED = (
    "received", "reserved", "admitted", "planned", "computing", "computed", "adopted",
)  # fmt: skip


def cached_by_tier(
    num_cached_tokens: int, plan: PrefixPlan | None, block_size: int
) -> dict[str, int]:
    """Where a prompt's cached tokens came from: fetched ones from the plan's source
    (kvstore or peer), the rest from the worker's own cache ("local")."""
    plan = plan or NO_PREFIX
    fetched = min(plan.fetched_blocks * block_size, num_cached_tokens)
    tiers = {"local": num_cached_tokens - fetched, "kvstore": 0, "peer": 0}
    if fetched:
        tiers[source_kind(plan.source)] += fetched
    return tiers


def seconds_between(marks: dict[str, float], start: str, end: str) -> float:
    """Seconds from moment `start` to `end` (0 unless both were marked)."""
    if start not in marks or end not in marks:
        return 0.0
    return max(0.0, marks[end] - marks[start])


def prefill_timing(
    marks: dict[str, float],
    cached: dict[str, int],
    loaded: tuple[int, float] = (0, 0.0),
    handoff: tuple[int, int] = (0, 0),
) -> PrefillTiming:
    """Stages from the moments marked (a moment never marked makes its stage 0); `loaded`:
    the prefix fetch's bytes and seconds; `handoff`: the KV bytes sent to decode and the
    prompt tokens whose KV decode held already."""
    between = lambda start, end: seconds_between(marks, start, end)
    return PrefillTiming(
        reserve=between(RECEIVED, RESERVED),
        prefix=between(ADMITTED, PLANNED),
        queue=between(RESERVED, ADMITTED) + between(PLANNED, COMPUTING),
        compute=between(COMPUTING, COMPUTED),
        transfer=between(COMPUTED, ADOPTED),
        cached_local=cached["local"],
        cached_kvstore=cached["kvstore"],
        cached_peer=cached["peer"],
        prefix_bytes=loaded[0],
        prefix_load=loaded[1],
        handoff_bytes=handoff[0],
        held_decode=handoff[1],
    )
