"""The gateway's token source in `kvstack serve`: an engine in this process, stepped on
its own thread (`shared/engine/loop.py`), prefilling and decoding in the same steps
(chunked prefill). No placement and no KV transfer: a request goes into the engine, and
each step's output becomes the token event a decode worker would have published."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncGenerator

from services.gateway.errors import from_status, service_unavailable
from services.gateway.progress import Progress
from services.gateway.protocol import GenerateRequest
from shared.decode.tokens import token_event
from shared.engine.interface import EngineInterface
from shared.engine.loop import EngineLoop
from shared.engine.output import RequestOutput
from shared.engine.runner import SeqChunk
from shared.errors import InvalidRequest
from shared.messages import PrefillTiming, TokenEvent


class EngineBackend:
    def __init__(self) -> None:
        self.engine_loop: EngineLoop | None = None  # None until the engine has loaded
        self.closing = False  # shutting down: what is in flight ends with a 503
        self._events: dict[str, asyncio.Queue[TokenEvent]] = {}
        self._added: dict[str, float] = {}  # monotonic, until its first token
        self._computing: dict[str, float] = {}  # its first step began (engine thread)

    def attach(self, engine_loop: EngineLoop) -> None:
        self.engine_loop = engine_loop

    def progress(self, req: GenerateRequest) -> Progress:
        """One attempt: an engine that fails here fails everywhere (no worker to move to)."""
        return Progress(req, max_attempts=1, migration_limit=0)

    async def generate(self, progress: Progress) -> AsyncGenerator[TokenEvent, None]:
        engine_loop = self._engine_loop()
        request_id = progress.next_attempt()
        events: asyncio.Queue[TokenEvent] = asyncio.Queue()
        self._events[request_id] = events
        finished = False
        try:
            await self._add(engine_loop, request_id, progress)
            while not finished:
                event = await events.get()
                if event.error:
                    raise from_status(event.code, event.error)
                finished = event.finished
                yield progress.record(event)
        finally:
            self._forget(request_id)
            if not finished:  # the client left, or an error: nothing more to compute
                engine_loop.call(lambda e: e.abort(request_id))

    def _engine_loop(self) -> EngineLoop:
        if self.closing:
            raise service_unavailable("the server is shutting down", retry_after_s=1)
        if self.engine_loop is None:
            raise service_unavailable("the model is still loading", retry_after_s=1)
        return self.engine_loop

    async def _add(self, engine_loop: EngineLoop, request_id: str, progress: Progress) -> None:
        self._added[request_id] = time.monotonic()
        prompt, params = progress.prompt_token_ids, progress.params
        try:
            await engine_loop.call(lambda e: e.add_request(request_id, prompt, params))
        except InvalidRequest as e:  # the gateway checked it; the engine's limits are its own
            raise from_status(400, str(e)) from None

    def _forget(self, request_id: str) -> None:
        del self._events[request_id]
        self._added.pop(request_id, None)
        self._computing.pop(request_id, None)

    # -- engine thread ------------------------------------------------------------------

    def step(self, engine: EngineInterface) -> list[RequestOutput]:
        # NOTE: marked once a step, not by a layer hook: a step with a per-layer hook cannot
        # take the fused decode (every layer in one native call), and serve decoded at a
        # third of the engine's speed that way.
        return engine.step(on_scheduled=self._mark_computing)

    def _mark_computing(self, chunks: list[SeqChunk]) -> None:
        now = time.monotonic()
        for chunk in chunks:  # a dict's setdefault is atomic under the GIL
            self._computing.setdefault(chunk.request_id, now)

    # -- back on the event loop -------------------------------------------------------------

    def on_outputs(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            events = self._events.get(out.request_id)
            if events is not None:
                events.put_nowait(self._event(out))

    def _event(self, out: RequestOutput) -> TokenEvent:
        event = token_event(out, 0)
        added = self._added.pop(out.request_id, None)
        if added is None:  # not its first event
            return event
        return dataclasses.replace(event, prefill_timing=self._timing(out, added))

    def _timing(self, out: RequestOutput, added: float) -> PrefillTiming:
        """Its wait for a first step, and that step to its first token."""
        now = time.monotonic()
        computing = self._computing.pop(out.request_id, now)
        return PrefillTiming(
            queue=max(0.0, computing - added),
            compute=max(0.0, now - computing),
            cached_local=out.num_cached_tokens,
        )

    def end_all(self, reason: str) -> None:
        """Past the drain timeout: every request in flight ends with a retryable error."""
        self.closing = True
        for request_id, events in self._events.items():
            events.put_nowait(
                TokenEvent(
                    request_id, 0, finished=True, finish_reason="error", error=reason, code=503
                )
            )
