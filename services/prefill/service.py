"""The prefill worker: computes a prompt's KV, streams it layer by layer to the decode
worker chosen by the conductor, and produces the first token."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

from services.prefill.admission import Admission
from services.prefill.prefix import PrefixLoader
from services.prefill.sharing import EVENT_INTERVAL, CacheSharing
from services.prefill.streaming import (
    Target,
    held_tokens,
    kv_handoff,
    layer_spans,
    spans_nbytes,
)
from shared import subjects
from shared.engine.engine import LLMEngine
from shared.engine.engine_thread import EngineThread
from shared.engine.interface import EngineInterface
from shared.engine.loop import EngineLoop
from shared.engine.output import RequestOutput
from shared.engine.runner import SeqChunk
from shared.engine.stats import tokens_to_compute
from shared.errors import is_prefix_load_failure
from shared.hashing import block_hashes
from shared.kvpool.block_fetch import BlockFetcher
from shared.kvpool.kvstore_client import write_back
from shared.messages import (
    Abort,
    Ack,
    BlockGet,
    Heartbeat,
    KVCommit,
    KVReservation,
    KVReserve,
    KVResync,
    PrefillRequest,
    PrefillTiming,
    StatsRequest,
    TokenEvent,
    WorkerStats,
)
from shared.prefill.admission import engine_can_take
from shared.prefill.load import prefill_load
from shared.prefill.metrics import PrefixCounters
from shared.prefill.outcome import (
    finish_at_first_token,
    kv_is_whole,
    refused_code,
    streams_verdict,
)
from shared.prefill.prefix import PrefixPlan, source_kind
from shared.prefill.timing import (
    ADMITTED,
    ADOPTED,
    COMPUTED,
    COMPUTING,
    PLANNED,
    RECEIVED,
    RESERVED,
    cached_by_tier,
    prefill_timing,
    seconds_between,
)
from shared.runtime import tracing
from shared.runtime.bus import Bus, ServiceUnavailable
from shared.runtime.heartbeats import subscribe_heartbeats
from shared.runtime.service import Service
from shared.transfer.address import advertised
from shared.transfer.factory import make_sender
from shared.transfer.inbox import KVInbox
from shared.transfer.tcp import TcpKVReceiver, TcpKVSender
from shared.worker.config import WorkerConfig, prompt_problem, worker_heartbeat, worker_stats
from shared.worker.core import error_code, intake_refusal
from shared.worker.metrics import LoadGauges, show_engine
from shared.worker.pool import open_kv_pool

log = logging.getLogger("kvstack.prefill")


class PrefillService(Service):
    name = "prefill"
    bus: Bus  # connected before start() (shared/runtime/service.py: run)

    def __init__(self, config: WorkerConfig) -> None:
        super().__init__(config)
        self.config: WorkerConfig = config
        self.targets: dict[str, list[Target]] = {}  # one per decode worker or KV shard
        # The moments each request reached (shared/prefill/timing.py): its timing, and
        # debug logs of its stages.
        self.marks: dict[str, dict[str, float]] = {}
        self.requests: dict[str, PrefillRequest] = {}
        # accepted, not in the engine yet (reserving on decode, queued, binding a prefix):
        # tokens to compute, as expected
        self.arriving: dict[str, int] = {}
        self.plans: dict[str, PrefixPlan] = {}  # where each prompt's prefix comes from
        self.num_done = 0
        self.spans = tracing.RequestSpans()  # "prefill.request": accepted to first token
        self.prompt_tokens = self.metrics.counter(
            "prompt_tokens", "prompt tokens computed (not found in a prefix cache)"
        )
        self.prefix_hits = PrefixCounters.of(self.metrics)
        self.load_gauges = LoadGauges.of(self.metrics)

    async def start(self, bus: Bus) -> None:
        loop = asyncio.get_running_loop()
        self.engine_thread = EngineThread()  # built where it steps: engine_thread.py
        self.engine: EngineInterface = await self.engine_thread.run(
            LLMEngine, self.config.engine_config()
        )
        show_engine(self.metrics, self.engine.info)
        token, encrypt = self.config.data_token or None, self.config.data_encrypt
        ring = self.config.shared_memory
        self.sender = TcpKVSender(token, encrypt=encrypt, shared_memory=ring)  # pool and peers
        self.kv_out = make_sender(self.config.transport, token, encrypt=encrypt, ring=ring)
        self.inbox = KVInbox(self.engine.kv_storage, loop)
        self.receiver = TcpKVReceiver(
            self.inbox,
            self.config.data_host,
            self.config.data_port,
            token,
            encrypt=encrypt,
            shared_memory=ring,
        )
        bound = self.receiver.start()  # listen even when peers dial another address
        self.data_addr = advertised(bound, self.config.advertise_data_addr)
        self.engine_loop = EngineLoop(
            self.engine, loop, self._on_outputs, step=self._step, thread=self.engine_thread
        )
        storage = self.engine.kv_storage
        self.pool = await open_kv_pool(
            self.config,
            self.worker_id,
            bus,
            self.sender,
            storage,
            self.inbox,
            self.data_addr,
            self.receiver,
        )
        peers = BlockFetcher(
            bus, self.inbox, self.pool.layout, self.data_addr, self.config.request_timeout
        )
        self.loader = PrefixLoader(self.engine_loop, self.pool, peers, self.inbox, tasks=self.tasks)
        step_tokens = self.config.max_num_batched_tokens
        self.admission = Admission(lambda: engine_can_take(self.engine.stats(), step_tokens))
        self.engine_loop.on_step = self._stepped
        self.sharing = CacheSharing(self.worker_id, bus, self.engine_loop, self.sender)
        self.engine_loop.on_broken = lambda reason: self.fail(f"engine broken: {reason}")
        self.engine_loop.start()
        await bus.serve(
            subjects.prefill_submit(self.worker_id), self._submit, expected=PrefillRequest
        )
        await bus.serve(
            subjects.prefill_get(self.worker_id), self.sharing.serve_get, expected=BlockGet
        )
        await bus.serve(
            subjects.worker_stats(self.name, self.worker_id), self._stats, expected=StatsRequest
        )
        await bus.subscribe(subjects.abort(), self._on_abort, expected=Abort)
        await subscribe_heartbeats(bus, self._on_heartbeat)
        await bus.subscribe(subjects.kv_resync(), self.sharing.resync, expected=KVResync)
        self.tasks.every(EVENT_INTERVAL, self.sharing.publish_events, "publishing KV events")
        self.tasks.every(self.config.heartbeat_interval, self.pool.report, "reporting the pool")
        self._data_plane_metrics()
        self._load_or_compute_metrics()

    def _data_plane_metrics(self) -> None:
        m = self.metrics
        m.counter_of(
            "kv_transfer_bytes",
            "KV bytes streamed to decode workers (--transport)",
            lambda: self.kv_out.bytes_sent,
        )
        m.counter_of(
            "data_sent_bytes",
            "data-plane bytes sent: the KV stream, shards, write-backs, blocks to peers",
            lambda: self.kv_out.bytes_sent + self.sender.bytes_sent,
        )
        m.counter_of(
            "data_received_bytes",
            "data-plane bytes received: prefix blocks from the pool and peers",
            lambda: self.receiver.bytes_received,
        )

    def _load_or_compute_metrics(self) -> None:
        m = self.metrics
        m.counter_of(
            "prefix_load_declined",
            "prefixes computed where loading them was predicted slower (shared/prefill/worth.py)",
            lambda: self.loader.declined,
        )
        m.counter_of(
            "prefix_load_stalled",
            "prefix fetches given up past their bound: the prompt's own prefill time",
            lambda: self.loader.stalled,
        )

    async def _on_heartbeat(self, hb: Heartbeat) -> None:
        self.pool.observe(hb)

    def heartbeat(self) -> Heartbeat:
        # NOTE: a copy in one call: the engine thread removes prompts it takes
        load = prefill_load(self.engine.stats(), list(self.arriving.values()))
        self.load_gauges.show(load)
        return worker_heartbeat(
            self.name,
            self.worker_id,
            self.config,
            self.engine,
            self.http_addr,
            self.data_addr,
            self.draining,
            load=load,
        )

    async def drain(self) -> None:
        """Prefill what was accepted to its first token (new submits get a retryable 503)."""
        while self.requests:
            await asyncio.sleep(0.05)

    async def abandon(self) -> None:
        """Past the drain timeout: end what is left with a retryable error (the gateway
        places it again elsewhere)."""
        for req in list(self.requests.values()):
            await self._fail(req, f"prefill worker {self.worker_id} is stopping", 503)

    async def stop(self) -> None:
        self.engine_loop.stop()
        self.receiver.stop()
        self.sender.close()
        self.kv_out.close()
        await self.pool.close()

    # -- requests ---------------------------------------------------------------------

    async def _submit(self, req: PrefillRequest) -> Ack:
        refusal = intake_refusal(
            self.draining, prompt_problem(self.engine, req.prompt_token_ids), self.name
        )
        if refusal is not None:
            return Ack(req.request_id, False, refusal.reason, refusal.code)
        self.requests[req.request_id] = req
        self.arriving[req.request_id] = len(req.prompt_token_ids)
        self.spans.open(req.request_id, "prefill.request", _span_attributes(req))
        self.tasks.spawn(
            self._run(req), f"request {req.request_id}", on_error=lambda e: self._crashed(req, e)
        )
        return Ack(req.request_id, True)

    async def _crashed(self, req: PrefillRequest, error: BaseException) -> None:
        """A bug ended the request's task: end the request too, and free what it held."""
        rid = req.request_id
        self.targets.pop(rid, None)
        self.plans.pop(rid, None)
        self.loader.forget(rid)
        await self.engine_loop.call(lambda e: e.abort(rid) and None)
        await self.engine_loop.call(lambda e: e.release(rid))
        if rid in self.requests:
            await self._fail(req, f"internal error: {type(error).__name__}: {error}", 500)
        await self._tell_decode(req.decode_id, KVCommit(rid, False, reason="prefill failed"))

    async def _run(self, req: PrefillRequest) -> None:
        self.marks[req.request_id] = {RECEIVED: time.monotonic()}
        reservation = await self._reserve(req)
        self._mark(req.request_id, RESERVED)
        self._trace(req.request_id, "decode reserved blocks")
        if req.request_id not in self.requests:  # aborted while reserving
            if reservation.ok:
                await self._cancel_reservation(req)
            return
        if not reservation.ok:
            return await self._fail(req, reservation.reason, reservation.code)
        hashes = self._block_hashes(req)
        self.targets[req.request_id] = _targets(req, reservation, self.config.block_size)
        if self.admission.must_wait():  # in the background: it queues meanwhile
            self.tasks.spawn(self._expect(req, hashes), f"sizing queued {req.request_id}")
        async with self.admission.turn(req.request_id) as admitted:
            if not admitted or req.request_id not in self.requests:  # aborted or failed
                self.targets.pop(req.request_id, None)
                return await self._cancel_reservation(req)
            self._mark(req.request_id, ADMITTED)
            await self._bind_and_add(req, hashes)

    async def _expect(self, req: PrefillRequest, hashes: list[int]) -> None:
        """While it queues, the prompt counts in the worker's load by the tokens it would
        compute with the prefix found now (its plan is made again when it leaves)."""
        plan = await self.loader.plan(req, hashes)
        if req.request_id in self.arriving:  # not ended meanwhile
            num_prefix = plan.blocks * self.config.block_size
            self.arriving[req.request_id] = tokens_to_compute(len(req.prompt_token_ids), num_prefix)

    async def _bind_and_add(self, req: PrefillRequest, hashes: list[int]) -> None:
        """Bind the prompt's prefix as it stands now (own cache, pool, peers) and add it to
        the engine."""
        plan = await self.loader.prepare(req, hashes)
        self.plans[req.request_id] = plan
        self._mark(req.request_id, PLANNED)
        external = plan.blocks * self.config.block_size
        self._trace(req.request_id, f"prefix planned ({external} tokens not computed)")
        prefill_only = dataclasses.replace(req.params, max_tokens=1)

        def add(engine: EngineInterface) -> None:
            engine.add_request(
                req.request_id,
                req.prompt_token_ids,
                prefill_only,
                hold_kv=True,
                external_tokens=external,
            )
            # NOTE: here, not after the await: the call waits for a step boundary, and a
            # heartbeat in between would count the prompt nowhere
            self.arriving.pop(req.request_id, None)  # the engine counts it from here

        await self.engine_loop.call(add)

    def _stepped(self, _step_seconds: float) -> None:
        """Engine thread, after each step: the engine may take a queued prompt now."""
        if len(self.admission):
            self.engine_loop.loop.call_soon_threadsafe(self.admission.wake)

    async def _cancel_reservation(self, req: PrefillRequest) -> None:
        await self._tell_decode(req.decode_id, KVCommit(req.request_id, False, reason="aborted"))

    async def _reserve(self, req: PrefillRequest) -> KVReservation:
        message = KVReserve(
            req.request_id,
            req.prompt_token_ids,
            req.params,
            self.config.block_size,
            self.engine.info.namespace,
            req.deadline,
            self.worker_id,
            req.stage_tbt_slo,
        )
        try:
            return await self.bus.request(
                subjects.decode_reserve(req.decode_id),
                message,
                self.config.request_timeout,
                expected=KVReservation,
                parent=self.spans.get(req.request_id),
            )
        except ServiceUnavailable as e:
            return KVReservation(req.request_id, False, reason=f"decode worker: {e}", code=503)

    def _block_hashes(self, req: PrefillRequest) -> list[int]:
        return block_hashes(
            req.prompt_token_ids, self.config.block_size, self.engine.info.namespace
        )

    # -- engine thread ----------------------------------------------------------------

    def _step(self, engine: EngineInterface) -> list[RequestOutput]:
        return engine.step(layer_hook=self._send_layer, layer_gate=self._before_layer)

    def _before_layer(self, layer: int, chunks: list[SeqChunk]) -> None:
        if layer == 0:  # its compute starts (a prefix load overlaps it from here)
            for chunk in chunks:  # engine thread: a dict's setdefault is atomic under the GIL
                self.marks.get(chunk.request_id, {}).setdefault(COMPUTING, time.monotonic())
        self.loader.gate(self.engine, layer, chunks)

    def _send_layer(self, layer: int, chunks: list[SeqChunk]) -> None:
        last_layer = layer == self.engine.info.model.num_layers - 1
        for chunk in chunks:
            for target in self.targets.get(chunk.request_id, ()):
                spans = layer_spans(self.engine.kv_storage, layer, chunk, target)
                if spans:
                    self._stream(target).send(target.peer, target.request_id, layer, spans)
                    target.bytes_sent += spans_nbytes(spans)
                if last_layer:  # (a chunk may end inside the blocks decode holds)
                    target.sent_upto = max(target.sent_upto, chunk.context_len)

    # -- back on the event loop ---------------------------------------------------------

    def _on_outputs(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            if not (out.finished and out.request_id in self.targets):
                continue
            if not self._recompute_in_place(out):
                self._finish_transfer(self.targets[out.request_id], out)

    def _recompute_in_place(self, out: RequestOutput) -> bool:
        """A prompt whose prefix fetch failed or stalled computes that prefix here, at once:
        its decode reservation and KV streams stay, where a retry through the gateway would
        be placed and queued anew. Once only: a prompt that loads nothing cannot fail so."""
        req = self.requests.get(out.request_id)
        failed_load = out.finish_reason == "error" and is_prefix_load_failure(str(out.stop_reason))
        if req is None or not req.load_prefix or not failed_load:
            return False
        computing = dataclasses.replace(req, load_prefix=False)
        self.requests[req.request_id] = computing
        self.tasks.spawn(
            self._recompute(computing, self.targets[req.request_id]),
            f"computing the prefix of {req.request_id}",
            on_error=lambda e: self._crashed(computing, e),
        )
        return True

    async def _recompute(self, req: PrefillRequest, targets: list[Target]) -> None:
        rid = req.request_id
        log.info("request %s: its prefix did not load; computing it here", rid)
        self.loader.forget(rid)
        self.plans.pop(rid, None)
        self.marks.get(rid, {}).pop(COMPUTING, None)  # its compute starts again
        await self.engine_loop.call(lambda e: e.release(rid))
        for target in targets:  # what went out was computed over a bad prefix: all again
            target.sent_upto = target.held
        if rid not in self.requests:  # aborted meanwhile (the engine no longer held it)
            return self._finish_transfer(targets, None)
        await self._bind_and_add(req, self._block_hashes(req))

    def _finish_transfer(self, targets: list[Target], out: RequestOutput | None) -> None:
        """End the request's streams of frames; commit (or cancel) once all are sent."""
        loop = asyncio.get_running_loop()
        results: list[tuple[bool, int, str]] = []

        def on_done(ok: bool, num_frames: int, error: str) -> None:
            loop.call_soon_threadsafe(settled, (ok, num_frames, error))

        def settled(result: tuple[bool, int, str]) -> None:
            results.append(result)
            if len(results) == len(targets):
                ok, num_frames, error = streams_verdict(results)
                req = self.requests.get(targets[0].request_id)
                self.tasks.spawn(
                    self._commit(out, targets[0], ok, num_frames, error),
                    f"committing {targets[0].request_id}",
                    on_error=None if req is None else lambda e: self._crashed(req, e),
                )

        self._mark(targets[0].request_id, COMPUTED)
        self._trace(targets[0].request_id, "computed; ending the KV stream")
        for target in targets:
            self._stream(target).finish(target.peer, target.request_id, on_done)

    def _stream(self, target: Target):
        """Attention workers take KV over TCP only; a decode worker over --transport."""
        return self.kv_out if target.kv_heads is None else self.sender

    async def _commit(
        self, out: RequestOutput | None, target: Target, sent: bool, num_frames: int, error: str
    ) -> None:
        rid = target.request_id
        handoff = kv_handoff(self.targets.pop(rid, [target]))
        plan = self.plans.pop(rid, None)
        load = self.loader.forget(rid)
        whole = out is not None and kv_is_whole(out.finish_reason, sent)
        if whole:  # in the background: the first token does not wait for the write-back
            self.tasks.spawn(
                self._write_back(rid, target),
                f"writing {rid} back to the pool",
                on_error=lambda _: self.engine_loop.call(lambda e: e.release(rid)),
            )
        else:
            await self.engine_loop.call(lambda e: e.release(rid))
        req = self.requests.get(rid)
        if req is None or out is None:  # aborted meanwhile
            await self._tell_decode(target.decode_id, KVCommit(rid, False, reason="aborted"))
        elif not whole:
            await self._tell_decode(
                target.decode_id, KVCommit(rid, False, reason=error or "failed")
            )
            code = error_code(out.error_kind)
            await self._fail(req, f"prefill failed: {error or out.stop_reason}", code)
        else:
            cached = cached_by_tier(out.num_cached_tokens, plan, self.config.block_size)
            self.prefix_hits.count(out.num_prompt_tokens, cached)
            if load is None:  # its compute did not wait for a fetch: the engine's rate
                loaded = (0, 0.0)
                computed = out.num_prompt_tokens - out.num_cached_tokens
                marks = self.marks.get(rid, {})
                self.loader.prefilled(computed, seconds_between(marks, COMPUTING, COMPUTED))
            else:
                loaded = load.measured()
                self.prefix_hits.loaded(source_kind(load.source), *loaded)
            await self._hand_over(req, out, target, num_frames, cached, (loaded, handoff))

    async def _hand_over(
        self,
        req: PrefillRequest,
        out: RequestOutput,
        target: Target,
        num_frames: int,
        cached: dict[str, int],
        moved: tuple[tuple[int, float], tuple[int, int]],
    ) -> None:
        """The KV is whole on the decode worker: it adopts the request (unless the first
        token ends it), and the first token goes out; `moved`: its prefix fetch's bytes
        and seconds, and its hand-off's (KV bytes sent, prompt tokens decode held)."""
        rid = req.request_id
        token = out.new_token_ids[0]
        logprob = out.new_logprobs[0] if out.new_logprobs else None
        self.prompt_tokens.inc(out.num_prompt_tokens - out.num_cached_tokens)
        stopped = self.engine.stop_reason(req.params, token) is not None
        done_here = finish_at_first_token(stopped, req.params.max_tokens)
        commit = KVCommit(
            rid,
            not done_here,
            num_frames,
            token,
            logprob,
            out.num_cached_tokens,
            reason="finished at the first token" if done_here else "",
        )
        self._trace(rid, "KV stream sent")
        reply = await self._tell_decode(target.decode_id, commit)
        self._mark(rid, ADOPTED)
        self._trace(rid, "decode adopted it")
        if not done_here and not reply.ok:
            reason = reply.error or "decode worker refused the KV"
            return await self._fail(req, reason, refused_code(reply.code))
        timing = prefill_timing(self.marks.get(rid, {}), cached, *moved)
        await self._emit_first(req, out, token, logprob, done_here, timing)

    async def _write_back(self, rid: str, target: Target) -> None:
        """Offer the prompt's full blocks to the KV pool (it keeps what it lacks), then
        free them here."""
        await write_back(self.pool, self.engine_loop, rid, f"{rid}:put")

    async def _tell_decode(self, decode_id: str, commit: KVCommit) -> Ack:
        """Commit (or cancel) the KV; decode's span of the request follows ours."""
        try:
            return await self.bus.request(
                subjects.decode_commit(decode_id),
                commit,
                self.config.request_timeout,
                expected=Ack,
                parent=self.spans.get(commit.request_id),
            )
        except ServiceUnavailable as e:
            return Ack(commit.request_id, False, f"decode worker: {e}", 503)

    async def _emit_first(
        self,
        req: PrefillRequest,
        out: RequestOutput,
        token: int,
        logprob,
        finish_reason: str | None,
        timing: PrefillTiming,
    ) -> None:
        event = TokenEvent(
            req.request_id,
            0,
            (token,),
            (logprob,) if logprob else None,
            finish_reason is not None,
            finish_reason,
            out.num_prompt_tokens,
            out.num_cached_tokens,
            prefill_timing=timing,
        )
        await self.bus.publish(subjects.tokens(req.request_id), event)
        self.spans.close(req.request_id, _prefilled(out))
        self._done(req.request_id)

    async def _fail(self, req: PrefillRequest, error: str, code: int) -> None:
        log.info("request %s failed: %s", req.request_id, error)
        event = TokenEvent(
            req.request_id, 0, finished=True, finish_reason="error", error=error, code=code
        )
        await self.bus.publish(subjects.tokens(req.request_id), event)
        self.spans.close(req.request_id, error=error)
        self._done(req.request_id)

    def _done(self, request_id: str) -> None:
        self.requests.pop(request_id, None)
        self.admission.leave(request_id)
        self.plans.pop(request_id, None)
        self.arriving.pop(request_id, None)
        self.marks.pop(request_id, None)
        self.num_done += 1
        self.beat_now()  # its tokens left the queue the last beat reported

    def _mark(self, request_id: str, moment: str) -> None:
        if request_id in self.marks:
            self.marks[request_id][moment] = time.monotonic()

    def _trace(self, request_id: str, what: str) -> None:
        marks = self.marks.get(request_id)
        if log.isEnabledFor(logging.DEBUG) and marks is not None:
            elapsed = (time.monotonic() - marks[RECEIVED]) * 1000
            log.debug("request %s +%.1f ms: %s", request_id, elapsed, what)

    async def _on_abort(self, msg: Abort) -> None:
        self.arriving.pop(msg.request_id, None)
        self.admission.leave(msg.request_id)
        self.spans.close(msg.request_id, error=f"aborted: {msg.reason}")
        if self.requests.pop(msg.request_id, None) is None:
            return
        aborted = await self.engine_loop.call(lambda e: e.abort(msg.request_id))
        targets = self.targets.get(msg.request_id)
        if aborted and targets:
            self._finish_transfer(targets, None)  # blocks are freed once the sends are done

    async def _stats(self, _: StatsRequest) -> WorkerStats:
        stats = worker_stats(self.worker_id, self.engine, len(self.targets), self.num_done)
        loaded = self.loader.blocks_loaded
        return dataclasses.replace(
            stats,
            blocks_from_kvstore=loaded["kvstore"],
            blocks_from_peers=loaded["peer"],
            blocks_served=self.sharing.blocks_served,
        )


def _span_attributes(req: PrefillRequest) -> dict:
    return {
        "gen_ai.usage.input_tokens": len(req.prompt_token_ids),
        "kvstack.decode_id": req.decode_id,
    }


def _prefilled(out: RequestOutput) -> dict:
    return {
        "kvstack.cached_tokens": out.num_cached_tokens,
        "kvstack.computed_tokens": out.num_prompt_tokens - out.num_cached_tokens,
    }


def _targets(req: PrefillRequest, reservation: KVReservation, block_size: int) -> list[Target]:
    """One stream to the decode worker, or one per KV shard of its attention group."""
    if not reservation.shards:
        held = held_tokens(reservation, len(req.prompt_token_ids), block_size)
        addr, block_ids = reservation.data_addr, reservation.block_ids
        return [Target(req.request_id, addr, req.decode_id, block_ids, held, held=held)]
    return [
        Target(
            req.request_id,
            shard.data_addr,
            req.decode_id,
            reservation.block_ids,
            kv_heads=(shard.kv_head_start, shard.kv_head_end),
        )
        for shard in reservation.shards
    ]
