"""The gateway's side of NATS: place a request, dispatch it, relay its tokens in order.

Each attempt has its own internal request id, so a retry never sees a stale token of
an earlier attempt. A retryable failure (no worker answered, KV refused) before any
token reached the client is retried; anything else becomes an ApiError.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from services.gateway.errors import from_status, service_unavailable
from services.gateway.liveness import Liveness
from services.gateway.protocol import GenerateRequest
from shared import codec, subjects
from shared.bus import Bus, ServiceUnavailable
from shared.errors import is_overload
from shared.hashing import block_hashes
from shared.messages import Abort, Ack, Placement, PlacementRequest, PrefillRequest, TokenEvent

log = logging.getLogger("kvstack.gateway")


@dataclass(frozen=True)
class BackendTimeouts:
    control: float = 5.0          # one request/reply on the bus
    first_token: float = 300.0    # placement to first token (queueing included)
    next_token: float = 60.0      # silence between two tokens of a running request
    max_attempts: int = 3


class _Retry(Exception):
    def __init__(self, reason: str, exclude: tuple[str, ...] = ()) -> None:
        super().__init__(reason)
        self.exclude = exclude


class Backend:
    def __init__(self, bus: Bus, timeouts: BackendTimeouts, block_size: int = 16,
                 namespace: str = "", liveness: Liveness | None = None) -> None:
        self.bus = bus
        self.timeouts = timeouts
        self.block_size = block_size
        self.namespace = namespace
        self.liveness = liveness or Liveness()

    async def generate(self, req: GenerateRequest) -> AsyncIterator[TokenEvent]:
        """Token events of `req` in order; the last one has finished=True."""
        exclude: tuple[str, ...] = ()
        reason = ""
        for attempt in range(self.timeouts.max_attempts):
            try:
                async for event in self._attempt(req, f"{req.request_id}-{attempt}", exclude):
                    yield event
                return
            except _Retry as retry:
                reason, exclude = str(retry), exclude + retry.exclude
                log.info("request %s: attempt %d failed (%s); retrying", req.request_id,
                         attempt + 1, reason)
        raise service_unavailable(f"request failed after {self.timeouts.max_attempts} "
                                  f"attempts: {reason}", retry_after_s=1)

    async def _attempt(self, req: GenerateRequest, internal_id: str,
                       exclude: tuple[str, ...]) -> AsyncIterator[TokenEvent]:
        events: asyncio.Queue[TokenEvent] = asyncio.Queue()
        sub = await self.bus.nc.subscribe(subjects.tokens(internal_id), cb=_enqueuer(events))
        finished = False
        try:
            placement = await self._place(req, internal_id, exclude)
            await self._submit(req, internal_id, placement)
            async for event in self._ordered(events, (placement.prefill_id, placement.decode_id)):
                self._check(event, delivered=event.seq > 0)
                finished = event.finished
                yield event
                if finished:
                    return
        finally:
            await sub.unsubscribe()
            if not finished:
                asyncio.ensure_future(self.bus.publish(subjects.abort(),
                                                       Abort(internal_id, "gateway gave up")))

    def first_block_hash(self, req: GenerateRequest) -> int:
        """The hash naming the prompt's first full block (0: shorter than a block)."""
        first = req.prompt_token_ids[:self.block_size]
        hashes = block_hashes(first, self.block_size, self.namespace)
        return hashes[0] if hashes else 0

    async def _place(self, req: GenerateRequest, internal_id: str,
                     exclude: tuple[str, ...]) -> Placement:
        hashes = tuple(block_hashes(req.prompt_token_ids, self.block_size, self.namespace))
        message = PlacementRequest(internal_id, req.num_prompt_tokens, req.params.max_tokens,
                                   time.time() + self.timeouts.first_token, hashes, exclude,
                                   req.slo_ttft, req.slo_tbt)
        try:
            placement = await self.bus.request(subjects.place(), message, self.timeouts.control,
                                               expected=Placement)
        except ServiceUnavailable:
            raise service_unavailable("the conductor is not available", retry_after_s=1)
        if not placement.accepted:
            raise service_unavailable(f"request rejected: {placement.reason}",
                                      retry_after_s=placement.retry_after or 1)
        return placement

    async def _submit(self, req: GenerateRequest, internal_id: str, placement: Placement) -> None:
        message = PrefillRequest(internal_id, req.prompt_token_ids, req.params,
                                 placement.decode_id, time.time() + self.timeouts.first_token,
                                 placement.prefix_peer, placement.prefix_peer_blocks,
                                 placement.load_prefix, placement.stage_tbt_slo)
        try:
            ack = await self.bus.request(subjects.prefill_submit(placement.prefill_id), message,
                                         self.timeouts.control, expected=Ack)
        except ServiceUnavailable as e:
            raise _Retry(str(e), (placement.prefill_id,))
        if not ack.ok:
            if ack.code == 503:
                raise _Retry(ack.error, (placement.prefill_id,))
            raise from_status(ack.code, ack.error)

    async def _ordered(self, events: asyncio.Queue,
                       workers: tuple[str, ...]) -> AsyncIterator[TokenEvent]:
        """Events by `seq` (prefill and decode publish separately), with timeouts."""
        pending: dict[int, TokenEvent] = {}
        expected = 0
        while True:
            while expected in pending:
                yield pending.pop(expected)
                expected += 1
            timeout = self.timeouts.first_token if expected == 0 else self.timeouts.next_token
            event = await self._next(events, timeout, workers, delivered=expected > 0)
            pending[event.seq] = event

    async def _next(self, events: asyncio.Queue, timeout: float, workers: tuple[str, ...],
                    delivered: bool) -> TokenEvent:
        """The next event; checks once a second that the request's workers still beat."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                return await asyncio.wait_for(events.get(), min(1.0, deadline - time.monotonic()))
            except TimeoutError:
                dead = self.liveness.dead(workers)
                if dead is not None:
                    reason = f"worker {dead} stopped responding"
                    if not delivered:
                        raise _Retry(reason, (dead,)) from None
                    raise service_unavailable(reason, retry_after_s=1) from None
        raise service_unavailable(f"no token for {timeout:.0f}s; a worker may have stopped",
                                  retry_after_s=1)

    @staticmethod
    def _check(event: TokenEvent, delivered: bool) -> None:
        if not event.error:
            return
        if event.code == 503 and not delivered and not is_overload(event.error):
            raise _Retry(event.error)
        raise from_status(event.code, event.error)


def _enqueuer(events: asyncio.Queue):
    async def on_msg(msg) -> None:
        try:
            events.put_nowait(codec.decode(msg.data, TokenEvent))
        except codec.MessageError as e:
            log.warning("dropped a bad token event: %s", e)
    return on_msg
