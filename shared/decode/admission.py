"""Whether a decode worker reserves blocks for a request's KV before prefill sends it."""

from __future__ import annotations

from shared.worker.core import Refusal, draining_refusal, invalid_prompt

# Tokens of output an admitted request must still have room for: admission is refused
# ("cannot admit") rather than filling the pool so tightly that requests preempt at once.
ADMISSION_HEADROOM_TOKENS = 64

REFORMING = Refusal("attention", "decode worker is re-forming its attention group", 503)
LAYOUT_MISMATCH = Refusal(
    "layout", "prefill and decode workers run a different model or KV layout", 500
)
KV_FULL = Refusal("kv_full", "cannot admit: KV cache full", 503)


def reservation_refusal(
    draining: bool, reattaching: bool, layout_matches: bool, prompt_problem: str
) -> Refusal | None:
    """Why a reservation is refused before any block is looked at, or None. Draining and
    re-forming are passing states (503: placed elsewhere); another layout is a deployment
    error (500); an invalid prompt is the client's (400)."""
    if draining:
        return draining_refusal("decode")
    if reattaching:
        return REFORMING
    if not layout_matches:
        return LAYOUT_MISMATCH
    if prompt_problem:
        return invalid_prompt(prompt_problem)
    return None


def reservation_size(num_prompt_tokens: int, max_tokens: int) -> tuple[int, int]:
    """(tokens to reserve now, output headroom that must be free as well): the prompt's KV
    and the first token's, with room for up to ADMISSION_HEADROOM_TOKENS more."""
    return num_prompt_tokens + 1, min(max_tokens, ADMISSION_HEADROOM_TOKENS)


def reusable_blocks(num_prompt_tokens: int, block_size: int, offloaded: bool) -> int:
    """How many of a prompt's first blocks the worker may take from its own prefix cache
    rather than receive: its full blocks but the one holding the last token (so some KV
    always arrives, every layer of it), none when attention runs on attention workers (the
    KV lives there, not in this worker's cache)."""
    return 0 if offloaded else (num_prompt_tokens - 1) // block_size


def attention_refusal(problem: str) -> Refusal:
    """The attention group could not take the request's KV (a shard died or restarted)."""
    return Refusal("attention", problem, 503)


def reattach_needed(problem: str, reattaching: bool) -> bool:
    """A shard's KV is gone (`problem` says why): form the group anew, unless that is
    already under way."""
    return bool(problem) and not reattaching
