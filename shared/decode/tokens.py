"""The token events of the requests a decode worker adopted: numbered in order after the
prefill worker's first token (seq 0), the last one saying how the request ended."""

from __future__ import annotations

from shared.engine.output import RequestOutput
from shared.messages import TokenEvent
from shared.worker.core import error_code


class TokenSequencer:
    """The next event number of each request decoding here; a request leaves it with its
    last event. Not thread-safe: the event loop owns it."""

    def __init__(self) -> None:
        self._next_seq: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._next_seq)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._next_seq

    def request_ids(self) -> list[str]:
        return list(self._next_seq)

    def adopt(self, request_id: str) -> None:
        """The request decodes here from now on: its events follow prefill's seq 0."""
        self._next_seq[request_id] = 1

    def event(self, out: RequestOutput) -> TokenEvent | None:
        """The event of one step's output, or None for a request not decoding here. An
        engine error ends it with the error's code (503: another worker goes on)."""
        seq = self._next_seq.get(out.request_id)
        if seq is None:
            return None
        self._next_seq[out.request_id] = seq + 1
        if out.finished:
            del self._next_seq[out.request_id]
        return token_event(out, seq)

    def hand_back(self, request_id: str, error: str) -> TokenEvent | None:
        """The last event of a request this worker gives up (it stops): a retryable error,
        so the gateway places it again with the tokens so far. None when not decoding here;
        no token may follow it."""
        seq = self._next_seq.pop(request_id, None)
        if seq is None:
            return None
        return TokenEvent(
            request_id, seq, finished=True, finish_reason="error", error=error, code=503
        )

    def drop(self, request_id: str) -> bool:
        """The request was aborted: no more events. True when it was decoding here."""
        return self._next_seq.pop(request_id, None) is not None


def token_event(out: RequestOutput, seq: int) -> TokenEvent:
    """Event number `seq` of a request, from one step's engine output. An engine error ends
    it with the error's code (503: retryable elsewhere)."""
    error, code = "", 200
    if out.finished and out.finish_reason == "error":
        error, code = str(out.stop_reason), error_code(out.error_kind)
    return TokenEvent(
        out.request_id,
        seq,
        out.new_token_ids,
        out.new_logprobs,
        out.finished,
        out.finish_reason,
        out.num_prompt_tokens,
        out.num_cached_tokens,
        error,
        code,
    )
