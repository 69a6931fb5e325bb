"""The gateway's side of NATS: place a request, dispatch it, relay its tokens in order, and
place it again when a worker is lost.

Each attempt has its own internal request id, so no stale token of an earlier attempt can
mix in. An attempt that fails in a way another worker can fix (no worker answered, KV
refused, a worker died or was restarted, a worker handed the request back while stopping,
the gateway's or the worker's NATS connection was re-established and its token stream went
silent or shows a gap) raises `WorkerLost`; `Progress` decides whether
the request is retried (nothing arrived yet) or migrated (prompt + tokens so far are
prefilled again elsewhere and the same stream goes on), or has used up its attempts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass

from services.gateway.errors import from_status, service_unavailable
from services.gateway.liveness import Liveness
from services.gateway.progress import Progress, WorkerLost
from services.gateway.protocol import GenerateRequest
from shared import codec, subjects
from shared.errors import is_no_worker, is_overload
from shared.hashing import block_hashes
from shared.messages import Abort, Ack, Placement, PlacementRequest, PrefillRequest, TokenEvent
from shared.runtime.bus import Bus, ServiceUnavailable

log = logging.getLogger("kvstack.gateway")
PLACEMENT_RETRY_S = 0.5


@dataclass(frozen=True)
class BackendTimeouts:
    control: float = 5.0  # one request/reply on the bus
    first_token: float = 300.0  # placement to first token (queueing included)
    next_token: float = 60.0  # silence between two tokens of a running request
    max_attempts: int = 3  # placements before the first token arrived
    migration_limit: int = 3  # placements after tokens arrived (--migration-limit)
    placement_wait: float = 10.0  # waiting for a conductor or a live worker to place on


@dataclass
class _Attempt:
    """One placement of a request: its id, its workers and what it may be lost to."""

    request_id: str
    placement: Placement
    watched: tuple[tuple[str, str], ...]
    epoch: int  # the gateway's NATS (re)connections when it started
    connections: dict[str, int]  # each worker's NATS reconnections when it started


class Backend:
    def __init__(
        self,
        bus: Bus,
        timeouts: BackendTimeouts,
        block_size: int = 16,
        namespace: str = "",
        liveness: Liveness | None = None,
        on_lost: Callable[[str, bool], None] | None = None,
    ) -> None:
        self.bus = bus
        self.timeouts = timeouts
        self.block_size = block_size
        self.namespace = namespace
        self.liveness = liveness or Liveness()
        self.on_lost = on_lost  # (why, migrated) of each re-placement, for metrics
        self.epoch = 0  # NATS (re)connections: events may be lost in between
        self.closing = False  # shutting down: end what is in flight

    def reconnected(self) -> None:
        self.epoch += 1
        self.liveness.reconnected()

    def progress(self, req: GenerateRequest) -> Progress:
        return Progress(req, self.timeouts.max_attempts, self.timeouts.migration_limit)

    async def generate(self, progress: Progress) -> AsyncGenerator[TokenEvent, None]:
        """Token events of the request in order, across attempts; the last one has
        finished=True."""
        while True:
            try:
                async for event in self._attempt(progress):
                    yield progress.record(event)
                return
            except WorkerLost as lost:
                progress.lost(lost)  # raises once the request is out of attempts
                self._count(lost, progress)

    def _count(self, lost: WorkerLost, progress: Progress) -> None:
        moved = "migrating" if progress.token_ids else "retrying"
        log.info(
            "request %s: %s (%s) after %d tokens",
            progress.req.request_id,
            moved,
            lost,
            len(progress.token_ids),
        )
        if self.on_lost is not None:
            self.on_lost(lost.why, bool(progress.token_ids))

    async def _attempt(self, progress: Progress) -> AsyncIterator[TokenEvent]:
        request_id, epoch = progress.next_attempt(), self.epoch
        events: asyncio.Queue[TokenEvent] = asyncio.Queue()
        sub = await self.bus.nc.subscribe(subjects.tokens(request_id), cb=_enqueuer(events))
        finished = False
        try:
            asked = time.monotonic()
            placement = progress.placement = await self._place(progress, request_id)
            if not progress.token_ids:  # TTFT's: the attempt that gives the first token
                progress.placement_seconds = time.monotonic() - asked
            workers = (placement.prefill_id, placement.decode_id)
            attempt = _Attempt(
                request_id,
                placement,
                self.liveness.watch(workers),
                epoch,
                self.liveness.connections(workers),
            )
            await self._submit(progress, attempt)
            async for event in self._ordered(events, attempt):
                _check(event, attempt)
                finished = event.finished
                yield event
                if finished:
                    return
        finally:
            await sub.unsubscribe()
            if not finished:
                self.bus.tasks.spawn(
                    self.bus.publish(subjects.abort(), Abort(request_id, "gateway gave up")),
                    f"aborting {request_id}",
                )

    def first_block_hash(self, req: GenerateRequest) -> int:
        """The hash naming the prompt's first full block (0: shorter than a block)."""
        first = req.prompt_token_ids[: self.block_size]
        hashes = block_hashes(first, self.block_size, self.namespace)
        return hashes[0] if hashes else 0

    # -- placement and dispatch -------------------------------------------------------------

    async def _place(self, progress: Progress, request_id: str) -> Placement:
        """Ask the conductor; while none answers or no worker is live, ask again for up to
        `placement_wait` (a conductor or worker restart takes seconds); overload is final.
        Workers that lost this request are avoided while another can take it; when none
        can, they are asked again (the conductor places only on workers it hears): after a
        NATS node came back, both decode workers of a small cluster may have lost it once."""
        deadline = time.monotonic() + self.timeouts.placement_wait
        welcome_back = False
        while True:
            placement, reason = await self._ask_conductor(progress, request_id, welcome_back)
            if placement is not None and placement.accepted:
                return placement
            if not welcome_back and _none_left(placement) and progress.lost_workers:
                welcome_back = True
                continue
            if placement is not None and is_overload(placement.reason):
                raise service_unavailable(
                    f"request rejected: {placement.reason}",
                    retry_after_s=placement.retry_after or 1,
                )
            if self.closing or time.monotonic() + PLACEMENT_RETRY_S > deadline:
                raise service_unavailable(reason, retry_after_s=1)
            await asyncio.sleep(PLACEMENT_RETRY_S)

    async def _ask_conductor(
        self, progress: Progress, request_id: str, welcome_back: bool = False
    ) -> tuple[Placement | None, str]:
        prompt = progress.prompt_token_ids
        hashes = tuple(block_hashes(prompt, self.block_size, self.namespace))
        req = progress.req
        message = PlacementRequest(
            request_id,
            len(prompt),
            progress.params.max_tokens,
            time.time() + self.timeouts.first_token,
            hashes,
            self._avoided(progress, welcome_back),
            req.slo_ttft,
            req.slo_tbt,
        )
        try:
            placement = await self.bus.request(
                subjects.place(), message, self.timeouts.control, expected=Placement
            )
        except ServiceUnavailable:
            return None, "the conductor is not available"
        return placement, f"request rejected: {placement.reason}"

    def _avoided(self, progress: Progress, welcome_back: bool = False) -> tuple[str, ...]:
        """Workers not to place on: lost ones still run by the same process (a restarted
        one is welcome again; with `welcome_back`, so is one heard since the request lost
        it: it came back, as from a NATS node's cut), and ones that went quiet (the
        conductor sees it later)."""
        liveness = self.liveness
        lost = {
            w
            for w, instance in progress.lost_workers
            if liveness.instance(w) in (instance, None)
            and not (welcome_back and liveness.heard_since(w, progress.lost_at))
        }
        return tuple(sorted(lost.union(liveness.quiet())))

    async def _submit(self, progress: Progress, attempt: _Attempt) -> None:
        placement = attempt.placement
        message = PrefillRequest(
            attempt.request_id,
            progress.prompt_token_ids,
            progress.params,
            placement.decode_id,
            time.time() + self.timeouts.first_token,
            placement.prefix_peer,
            placement.prefix_peer_blocks,
            placement.load_prefix and not progress.recompute_prefix,
            placement.stage_tbt_slo,
        )
        try:
            ack = await self.bus.request(
                subjects.prefill_submit(placement.prefill_id),
                message,
                self.timeouts.control,
                expected=Ack,
            )
        except ServiceUnavailable as e:
            raise WorkerLost(str(e), attempt.watched[:1]) from e
        if not ack.ok:
            if ack.code == 503:
                raise WorkerLost(ack.error, attempt.watched[:1], "refused")
            raise from_status(ack.code, ack.error)

    # -- token events -------------------------------------------------------------------------

    async def _ordered(self, events: asyncio.Queue, attempt: _Attempt) -> AsyncIterator[TokenEvent]:
        """Events by `seq` (prefill and decode publish separately), with timeouts."""
        pending: dict[int, TokenEvent] = {}
        expected = 0
        while True:
            while expected in pending:
                yield pending.pop(expected)
                expected += 1
                if expected == 1:  # the prefill worker's part is done; only decode matters
                    attempt.watched = attempt.watched[1:]
            cut_off = self._cut_off(attempt) if pending else ""
            if cut_off:  # a gap after a reconnection: the missing events are lost
                raise WorkerLost(f"token events were lost: {cut_off}", why="reconnect")
            timeout = self.timeouts.first_token if expected == 0 else self.timeouts.next_token
            event = await self._next(events, timeout, attempt)
            pending[event.seq] = event

    async def _next(self, events: asyncio.Queue, timeout: float, attempt: _Attempt) -> TokenEvent:
        """The next event; checks once a second that the attempt's workers still beat."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                return await asyncio.wait_for(events.get(), min(1.0, deadline - time.monotonic()))
            except TimeoutError:
                self._check_attempt(attempt)
        if timeout == self.timeouts.first_token:
            raise service_unavailable(f"no first token within {timeout:.0f}s", retry_after_s=1)
        raise WorkerLost(
            f"no token from {attempt.placement.decode_id} for {timeout:.0f}s",
            attempt.watched[-1:],
            "timeout",
        )

    def _check_attempt(self, attempt: _Attempt) -> None:
        if self.closing:
            raise service_unavailable("the gateway is shutting down", retry_after_s=1)
        cut_off = self._cut_off(attempt)
        if cut_off:  # silent after a reconnection: its events may never come
            raise WorkerLost(f"{cut_off}; token events may have been lost", why="reconnect")
        if not self.bus.connected:  # cut off: silence says nothing about the workers
            return
        lost = self.liveness.lost(attempt.watched)
        if lost is not None:
            raise WorkerLost(lost[1], tuple(w for w in attempt.watched if w[0] == lost[0]))

    def _cut_off(self, attempt: _Attempt) -> str:
        """Why events of `attempt` may have been lost in NATS ("" if no reason to think so).

        NOTE: NATS core delivers at most once: what a client published just before its
        node died, or what was on its way to a subscriber on that node, is gone. The
        gateway knows of its own reconnections; a worker's come with its heartbeats (one
        is published at once after a reconnection). Without the worker's, a stream whose
        decode worker moved to another node waited `next_token` for events that were
        lost."""
        if attempt.epoch != self.epoch:
            return "the gateway's NATS connection was re-established"
        watched = tuple(w for w, _ in attempt.watched)
        worker = self.liveness.reconnected_worker(attempt.connections, watched)
        return f"worker {worker}'s NATS connection was re-established" if worker else ""


def _check(event: TokenEvent, attempt: _Attempt) -> None:
    """A worker's error event: retryable ones (503, not overload) are a lost worker; one
    from decode (seq > 0: it handed the request back, or its engine failed) is avoided in
    the next placement."""
    if not event.error:
        return
    if event.code == 503 and not is_overload(event.error):
        raise WorkerLost(event.error, attempt.watched[-1:] if event.seq > 0 else (), "refused")
    raise from_status(event.code, event.error)


def _enqueuer(events: asyncio.Queue):
    async def on_msg(msg) -> None:
        try:
            events.put_nowait(codec.decode(msg.data, TokenEvent))
        except codec.MessageError as e:
            log.warning("dropped a bad token event: %s", e)

    return on_msg


def _none_left(placement: Placement | None) -> bool:
    """A rejection because no worker of a kind could take the request (not overload)."""
    return placement is not None and not placement.accepted and is_no_worker(placement.reason)
