"""From a request's token events to what its client sees: text, logprobs, finish, usage."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from services.gateway.progress import Progress
from services.gateway.protocol import GenerateRequest
from services.gateway.responses import format_logprobs
from services.gateway.text import TextStream
from services.gateway.timing import ttft_breakdown
from services.gateway.token_source import TokenSource
from shared.logprob import TokenLogprob
from shared.model.tokenizer import Tokenizer


@dataclass
class Piece:
    text: str
    logprobs: dict | None  # formatted for the endpoint
    entries: tuple[TokenLogprob, ...]  # raw, for the non-streaming answer
    finish_reason: str | None


@dataclass
class Relay:
    req: GenerateRequest
    tokenizer: Tokenizer | None
    backend: TokenSource
    started: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    token_times: list[float] = field(default_factory=list)
    num_cached_tokens: int = 0
    stream: TextStream | None = None
    progress: Progress | None = None

    @property
    def migrations(self) -> int:
        return self.progress.migrations if self.progress else 0

    async def pieces(self) -> AsyncGenerator[Piece, None]:
        self.stream = stream = TextStream(
            self.tokenizer, self.req.prompt_token_ids, self.req.params
        )
        self.progress = self.backend.progress(self.req)
        events = self.backend.generate(self.progress)
        try:
            async for event in events:
                self._clock(len(event.token_ids))
                self.num_cached_tokens = event.num_cached_tokens
                piece = self._piece(
                    stream, event.token_ids, event.logprobs, event.finished, event.finish_reason
                )
                if piece is not None:
                    yield piece
                if piece is not None and piece.finish_reason:
                    return
        finally:
            await events.aclose()  # an unfinished request is aborted on the workers

    def timing(self) -> dict | None:
        """Its TTFT's breakdown (services/gateway/timing.py), once a token came."""
        progress = self.progress
        if progress is None or self.first_token_at is None:
            return None
        return ttft_breakdown(
            self.first_token_at - self.started,
            progress.placement_seconds,
            progress.prefill_timing,
            progress.decode_wait,
        )

    @property
    def num_output_tokens(self) -> int:
        return self.stream.num_tokens if self.stream is not None else 0

    def _piece(
        self, stream: TextStream, token_ids, logprobs, finished: bool, finish_reason: str | None
    ) -> Piece | None:
        update = stream.push(token_ids, logprobs)
        finish = "stop" if update.stopped else (finish_reason if finished else None)
        text = update.text + (stream.finish() if finish else "")
        entries = tuple(update.logprobs or ())
        formatted = format_logprobs(self.req, self.tokenizer, update.logprobs, update.text_offset)
        if not (text or finish or entries):
            return None
        return Piece(text, formatted if entries else None, entries, finish)

    def _clock(self, num_tokens: int) -> None:
        now = time.monotonic()
        if self.first_token_at is None:
            self.first_token_at = now
        if num_tokens:
            self.token_times.append(now)
