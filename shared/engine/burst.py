"""When decode steps may chain in one native call (EngineConfig.decode_burst), and how many:
pure functions of a request's params and the engine's recent step time."""

from __future__ import annotations

from shared.sampling_params import SamplingParams

# The most a burst of decode steps may take: its tokens reach the client in one event, so a
# client's gap between tokens may be this long. NOTE: a burst saves the Python between steps
# (306-351 us a step of SmolLM2 on 2 cores by `bench step-phases --batch 1`:
# docs/notes/2026-11-30-batch-1-decode-step.md, "Where a batch-1 step's time goes"), which only
# counts beside short steps: a model whose steps take 25 ms or more decodes a token a step and
# streams as before.
BURST_EVENT_SECONDS = 0.025


def burst_fits(steps: int, step_seconds: float) -> int:
    """How many of `steps` decode steps of `step_seconds` each one burst may chain: at most
    BURST_EVENT_SECONDS of them, at least one; one while no step has been timed."""
    if step_seconds <= 0:
        return 1
    return max(1, min(steps, int(BURST_EVENT_SECONDS / step_seconds)))


def bursts(params: SamplingParams) -> bool:
    """Whether a request's tokens may come from a burst: greedy, with nothing computed per
    token from its logits but the argmax (no logprobs, penalties, biases, min_tokens or
    grammar)."""
    return params.greedy and params.logprobs is None and not params.adjusts_logits
