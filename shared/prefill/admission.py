"""When a prefill worker lets the next accepted prompt into its engine.

A prompt binds its prefix (own cache, pool, peers) as it enters the engine, so it should
enter as late as it can without leaving the engine idle: when what the engine has left
to prefill fits in the few steps that binding takes. Prompts behind it wait in the
worker's own queue (services/prefill/admission.py), where blocks that reach the worker's
cache, the pool or a peer while they wait are still theirs to use. The simulator binds
at the start of a prefill for the same reason (loadgen/sim/prefill.py)."""

from __future__ import annotations

from shared.engine.stats import EngineStats

# Steps ahead a prompt is let in. NOTE: binding makes three engine calls (its local match,
# reserving the blocks, adding the prompt), and on a busy engine each waits for a step to
# end; let in one step ahead, a prompt missed the step it could have shared with the one
# before it (a live replay's mean TTFT rose by a tenth of a second).
LEAD_STEPS = 4


def engine_can_take(engine: EngineStats, step_tokens: int) -> bool:
    """Whether one more prompt should enter the engine now: what the engine has left to
    prefill (in progress and waiting) is less than LEAD_STEPS steps' worth."""
    return engine.queued_tokens < LEAD_STEPS * step_tokens
