"""How a prefill ends, once the engine computed the prompt and its KV streams ended: what
becomes of the prompt's blocks, whether the decode worker adopts the request, and with
which error a failed one ends."""

from __future__ import annotations

from collections.abc import Sequence

ENDED_BADLY = ("abort", "error")


def kv_is_whole(finish_reason: str | None, sent: bool) -> bool:
    """The prompt was computed and every KV stream sent it: its blocks are worth offering
    to the pool (written back in the background); otherwise they are released at once."""
    return finish_reason not in ENDED_BADLY and sent


def finish_at_first_token(stopped: bool, max_tokens: int) -> str | None:
    """The finish reason when the first token ends the request ("stop" when it is a stop
    token, "length" when only one was asked for), else None: the decode worker goes on.
    A request that ends here is not adopted, nor checked against the decode TBT."""
    if stopped:
        return "stop"
    return "length" if max_tokens == 1 else None


def refused_code(code: int) -> int:
    """The decode worker refused the KV: its code, or 503 (placed again) when it gave none."""
    return code if code != 200 else 503


def streams_verdict(results: Sequence[tuple[bool, int, str]]) -> tuple[bool, int, str]:
    """(ok, frames, error) of a request's KV streams, each given as (ok, frames, error).
    Every stream carries the same frames (one per layer and run of blocks), so their
    counts must agree; the first error otherwise."""
    counts = {num_frames for _, num_frames, _ in results}
    error = next((e for ok, _, e in results if not ok), "")
    if len(counts) > 1 and not error:
        error = f"KV streams sent different frame counts {sorted(counts)}"
    return not error, results[0][1], error
