"""The choices of one request (n, best_of): a relay per choice generated, run together.

Each choice is a request of its own on the workers (its own id, its own seed), so the
prefix cache makes every prefill after the first nearly free. With best_of above n, the
n choices with the highest sum of token logprobs are returned, as OpenAI ranks them.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field

from services.gateway.protocol import GenerateRequest
from services.gateway.relay import Piece, Relay
from services.gateway.responses import usage
from services.gateway.token_source import TokenSource
from shared.logprob import TokenLogprob
from shared.model.tokenizer import Tokenizer
from shared.sampling_params import SamplingParams

SEED_SPAN = 2**64  # seeds of the choices wrap inside the range torch accepts


@dataclass
class Answer:
    """One choice's whole reply, for a non-streamed response."""

    index: int
    source: int  # the relay that generated it
    text: str = ""
    finish_reason: str = "length"
    entries: list[TokenLogprob] = field(default_factory=list)

    def add(self, piece: Piece) -> None:
        self.text += piece.text
        self.entries.extend(piece.entries)
        self.finish_reason = piece.finish_reason or self.finish_reason

    @property
    def cumulative_logprob(self) -> float:
        return sum(entry.logprob for entry in self.entries)


@dataclass
class Choices:
    req: GenerateRequest
    relays: list[Relay]

    @classmethod
    def of(cls, req: GenerateRequest, tokenizer: Tokenizer | None, backend: TokenSource) -> Choices:
        return cls(req, [Relay(r, tokenizer, backend) for r in choice_requests(req)])

    async def pieces(self) -> AsyncGenerator[tuple[int, Piece], None]:
        """Every choice's pieces as they come, each with its choice's index."""
        if len(self.relays) == 1:
            async for piece in self.relays[0].pieces():
                yield 0, piece
            return
        async for item in merged([relay.pieces() for relay in self.relays]):
            yield item

    async def answers(self) -> list[Answer]:
        """The choices returned, whole, indexed from 0 (best first when best_of > n)."""
        answers = [Answer(i, i) for i in range(len(self.relays))]
        async for index, piece in self.pieces():
            answers[index].add(piece)
        if self.req.best_of > self.req.n:
            answers = sorted(answers, key=lambda a: a.cumulative_logprob, reverse=True)
        return [dataclasses.replace(a, index=i) for i, a in enumerate(answers[: self.req.n])]

    def usage(self, returned: list[int] | None = None) -> dict:
        """Prompt tokens once, and the completion tokens of the choices `returned`
        (default: all)."""
        relays = self.relays if returned is None else [self.relays[i] for i in returned]
        first = self.relays[0]
        return usage(
            self.req.num_prompt_tokens,
            sum(relay.num_output_tokens for relay in relays),
            first.num_cached_tokens,
            sum(relay.migrations for relay in self.relays),
            first.timing(),
        )


def choice_requests(req: GenerateRequest) -> list[GenerateRequest]:
    """The requests behind `req`'s choices: one per choice generated."""
    if req.best_of == 1:
        return [req]
    ranked = req.best_of > req.n
    return [
        dataclasses.replace(
            req, request_id=f"{req.request_id}-c{i}", params=_choice_params(req.params, i, ranked)
        )
        for i in range(req.best_of)
    ]


def _choice_params(params: SamplingParams, index: int, ranked: bool) -> SamplingParams:
    """A seeded request's choices draw differently (seed + index) and still repeatably;
    ranked ones report their sampled tokens' logprobs (what best_of ranks by)."""
    seed = None if params.seed is None else (params.seed + index) % SEED_SPAN
    logprobs = params.logprobs if params.logprobs is not None or not ranked else 0
    return dataclasses.replace(params, seed=seed, logprobs=logprobs)


async def merged(
    streams: list[AsyncGenerator[Piece, None]],
) -> AsyncIterator[tuple[int, Piece]]:
    """The pieces of several streams as each comes, tagged with its stream's index. The
    first error of any stream is raised here; leaving early (or an error) closes them all,
    which aborts their requests on the workers."""
    queue: asyncio.Queue[tuple[int, Piece | None, BaseException | None]] = asyncio.Queue()
    pumps = [asyncio.create_task(_pump(i, s, queue)) for i, s in enumerate(streams)]
    try:
        running = len(pumps)
        while running:
            index, piece, error = await queue.get()
            if error is not None:
                raise error
            if piece is None:
                running -= 1
                continue
            yield index, piece
    finally:
        for pump in pumps:
            pump.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)


async def _pump(
    index: int,
    stream: AsyncGenerator[Piece, None],
    queue: asyncio.Queue[tuple[int, Piece | None, BaseException | None]],
) -> None:
    """One stream into the queue, then its end (None) or its error: the consumer owns
    both, so nothing this task raises goes unseen."""
    try:
        async for piece in stream:
            queue.put_nowait((index, piece, None))
        queue.put_nowait((index, None, None))
    except Exception as exc:
        queue.put_nowait((index, None, exc))
    finally:
        await stream.aclose()
