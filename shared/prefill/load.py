"""What a prefill worker reports as its queue, the same for a live worker and a simulated
one: every prompt it accepted and has not finished, counted by the tokens it still has to
compute. The conductor turns those into queue seconds (shared/conductor/estimate.py), so a
prefill in progress, or a prompt still reserving KV on its decode worker, is never
invisible to it; and tokens a prompt will not compute (its prefix, cached or loaded) do
not make a worker look busier than it is."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

from shared.engine.stats import EngineStats


def tokens_left(to_compute: int, started: float, seconds: float, now: float) -> int:
    """Tokens a prefill of `to_compute` tokens, started at `started` and taking `seconds`,
    has left at `now`, taking it to run at an even pace."""
    if seconds <= 0 or now <= started:
        return to_compute
    return max(0, round(to_compute * (1.0 - (now - started) / seconds)))


def prefill_load(engine: EngineStats, arriving: Collection[int]) -> EngineStats:
    """The engine's load (its prefills in progress and waiting), plus the prompts accepted
    but not in the engine yet: `arriving` holds their tokens to compute."""
    if not arriving:
        return engine
    return dataclasses.replace(
        engine,
        num_waiting=engine.num_waiting + len(arriving),
        queued_tokens=engine.queued_tokens + sum(arriving),
    )
