"""The decode worker: holds blocks for incoming KV, adopts requests once their KV has
landed intact, decodes them in continuous batches and streams tokens to the gateway."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

from services.decode.attention_group import AttentionGroup
from services.decode.incoming import LocalKV, OffloadedKV
from services.decode.offload_runner import OffloadRunner
from services.decode.pool_prefix import PoolPrefix
from shared import subjects
from shared.attention_groups import usable_group_size
from shared.decode.admission import (
    KV_FULL,
    attention_refusal,
    reattach_needed,
    reservation_refusal,
    reservation_size,
    reusable_blocks,
)
from shared.decode.commit import CommitVerdict, commit_verdict, current_tbt, holds_kv_for_pool
from shared.decode.tokens import TokenSequencer
from shared.engine.engine import LLMEngine
from shared.engine.engine_thread import EngineThread
from shared.engine.interface import EngineInterface
from shared.engine.loop import EngineLoop
from shared.engine.output import RequestOutput
from shared.errors import KvstackError
from shared.hashing import block_hashes
from shared.kvpool.kvstore_client import write_back
from shared.kvpool.pool import KVPool
from shared.messages import (
    Abort,
    Ack,
    Heartbeat,
    KVCommit,
    KVReservation,
    KVReserve,
    StatsRequest,
    TokenEvent,
    WorkerStats,
)
from shared.model.config import ModelConfig
from shared.model.registry import resolve_model
from shared.runtime import tracing
from shared.runtime.bus import Bus
from shared.runtime.heartbeats import subscribe_heartbeats
from shared.runtime.service import Service
from shared.transfer.address import advertised
from shared.transfer.attention.client import AttentionLost
from shared.transfer.base import KVReceiver
from shared.transfer.factory import make_receiver
from shared.transfer.inbox import KVInbox
from shared.transfer.tcp import TcpKVSender
from shared.worker.config import WorkerConfig, prompt_problem, worker_heartbeat, worker_stats
from shared.worker.core import Refusal
from shared.worker.metrics import LoadGauges, show_engine
from shared.worker.pool import open_kv_pool

log = logging.getLogger("kvstack.decode")

RESERVATION_TTL = 30.0
# At start attention workers may still be loading (a dozen processes share the machine):
# wait for them as long as `kvstack up` waits for the whole stack.
ATTENTION_START_WAIT = 300.0


class DecodeService(Service):
    name = "decode"
    bus: Bus  # connected before start() (shared/runtime/service.py: run)
    incoming: LocalKV | OffloadedKV

    def __init__(self, config: WorkerConfig) -> None:
        super().__init__(config)
        self.config: WorkerConfig = config
        self.decoding = TokenSequencer()
        self.adopted_at: dict[str, float] = {}  # until its first decoded token goes out
        self.spans = tracing.RequestSpans()  # "decode.request": KV commit to the last token
        self.group: AttentionGroup | None = None  # offloaded: the attention workers
        self.receiver: KVReceiver | None = None  # local KV: what prefill streams into
        self.pool: KVPool | None = None  # local KV: the KV pool (--kv-pool)
        self.pool_prefix: PoolPrefix | None = None  # local KV: prefixes it takes from the pool
        self.num_done = 0
        self.num_refused = 0
        self.num_rejected_after_prefill = 0
        self.tokens_out = self.metrics.counter("generation_tokens", "tokens generated")
        self.refused = self.metrics.counter("refused_requests", "reservations refused", ("reason",))
        self.transfers = self.metrics.counter(
            "kv_transfers", "KV transfers by outcome", ("result",)
        )
        self.wasted_prefill = self.metrics.counter(
            "wasted_prefill_tokens", "prompt tokens prefilled, then refused here (baseline)"
        )
        self.load_gauges = LoadGauges.of(self.metrics)
        self.recoveries = self.metrics.counter(
            "attention_recoveries", "attention groups re-formed after losing a worker"
        )

    async def start(self, bus: Bus) -> None:
        loop = asyncio.get_running_loop()
        token = self.config.data_token or None
        self.sender = TcpKVSender(
            token, encrypt=self.config.data_encrypt, shared_memory=self.config.shared_memory
        )
        self.reattaching = False
        self.engine_thread = EngineThread()  # built where it steps: engine_thread.py
        if self.config.attention_workers:
            await self._start_offloaded(bus, token)
        else:
            await self._start_local(bus, loop, token)
        info = self.engine.info
        if self.group is not None:  # attention runs on the group's workers
            info = dataclasses.replace(info, attention="offloaded")
        show_engine(self.metrics, info)
        self.engine_loop = EngineLoop(
            self.engine, loop, self._on_outputs, step=self._step, thread=self.engine_thread
        )
        self.engine_loop.on_broken = lambda reason: self.fail(f"engine broken: {reason}")
        self.engine_loop.start()
        self.tasks.every(1.0, self._expire_reservations, "expiring reservations")
        await bus.serve(subjects.decode_reserve(self.worker_id), self._reserve, expected=KVReserve)
        await bus.serve(subjects.decode_commit(self.worker_id), self._commit, expected=KVCommit)
        await bus.serve(
            subjects.worker_stats(self.name, self.worker_id), self._stats, expected=StatsRequest
        )
        await bus.subscribe(subjects.abort(), self._on_abort, expected=Abort)
        await subscribe_heartbeats(bus, self._on_heartbeat)
        self._data_plane_metrics()

    def _data_plane_metrics(self) -> None:
        """Local KV: the stream from prefill in, write-backs out; offloaded: q, k, v out
        to the attention workers and their outputs back."""
        group, receiver = self.group, self.receiver
        self.metrics.counter_of(
            "data_sent_bytes",
            "data-plane bytes sent: write-backs to the pool, q/k/v to attention workers",
            lambda: self.sender.bytes_sent + (group.counter("qkv_bytes") if group else 0),
        )
        self.metrics.counter_of(
            "data_received_bytes",
            "data-plane bytes received: KV from prefill, attention outputs",
            lambda: (
                (receiver.bytes_received if receiver else 0)
                + (group.counter("out_bytes") if group else 0)
            ),
        )

    async def _start_local(
        self, bus: Bus, loop: asyncio.AbstractEventLoop, token: str | None
    ) -> None:
        self.engine: EngineInterface = await self.engine_thread.run(
            LLMEngine, self.config.engine_config(prefills=False)
        )
        storage = self.engine.kv_storage
        inbox = KVInbox(storage, loop)
        receiver = make_receiver(
            self.config.transport,
            inbox,
            self.config.data_host,
            self.config.data_port,
            token,
            memory=[storage.host()],  # where frames land: the KV, or its host mirror
            encrypt=self.config.data_encrypt,
            ring=self.config.shared_memory,
        )
        bound = receiver.start()
        self.receiver = receiver
        self.data_addr = advertised(bound, self.config.advertise_data_addr)
        self.incoming = LocalKV(
            inbox, self.engine.info.model.num_layers, self.config.request_timeout
        )
        self.pool = await open_kv_pool(
            self.config, self.worker_id, bus, self.sender, storage, inbox, self.data_addr, receiver
        )
        self.tasks.every(self.config.heartbeat_interval, self.pool.report, "reporting the pool")
        if self.config.take_pool_prefix:
            self.pool_prefix = PoolPrefix(self.pool, inbox)
        self.metrics.counter_of(
            "pool_prefix_blocks",
            "prompt blocks taken from the KV pool at reservation (not sent by prefill)",
            lambda: self.pool_prefix.blocks_asked if self.pool_prefix else 0,
        )

    async def _start_offloaded(self, bus: Bus, token: str | None) -> None:
        """Attention goes to the group: attach it first, since its pool sizes ours."""
        config = self.config.engine_config(prefills=False)
        model = ModelConfig.from_dir(resolve_model(config.model))
        group = AttentionGroup(
            bus,
            self.worker_id,
            self.config.attention_workers,
            model,
            config.resolved_dtype,
            config.block_size,
            token,
            self.config.request_timeout,
        )
        await group.wait_for_workers(
            max(self.config.attention_recovery_timeout, ATTENTION_START_WAIT)
        )
        num_blocks = await group.attach()
        config = dataclasses.replace(
            config, num_blocks=num_blocks, local_kv=False, enable_prefix_cache=False
        )
        self.engine = await self.engine_thread.run(LLMEngine, config)
        micro_batches = self.config.micro_batches
        self.engine.use_runner(
            lambda runner: OffloadRunner(runner.model, runner.storage, group, micro_batches)
        )
        self.group, self.data_addr = group, ""
        self.incoming = OffloadedKV(group, model.num_layers)

    async def _on_heartbeat(self, hb: Heartbeat) -> None:
        if self.pool is not None:
            self.pool.observe(hb)
        lost = self.group.lost_member(hb) if self.group is not None else ""
        if reattach_needed(lost, self.reattaching):
            await self._reattach(lost)

    async def _reattach(self, reason: str) -> None:
        """A shard's KV is gone while no step noticed (e.g. this worker was idle): attach
        the group again and recompute what runs. The conductor places nothing here
        meanwhile (the beats say draining)."""
        self.reattaching = True
        try:
            outputs = await self.engine_loop.call(lambda e: self._recover(e, reason))
        finally:
            self.reattaching = False
        if outputs:
            self._on_outputs(outputs)

    def heartbeat(self) -> Heartbeat:
        self.load_gauges.show(self.engine.stats())
        return worker_heartbeat(
            self.name,
            self.worker_id,
            self.config,
            self.engine,
            self.http_addr,
            self.data_addr,
            self.draining or self.reattaching,
        )

    async def drain(self) -> None:
        """Decode what was adopted to the end (new reservations are refused meanwhile)."""
        while len(self.decoding) or len(self.incoming):
            await asyncio.sleep(0.05)

    async def abandon(self) -> None:
        """Past the drain timeout: hand each request still decoding back to its gateway,
        which places it again with the tokens so far (none is lost), and free it here."""
        await self._hand_back_all(f"decode worker {self.worker_id} is stopping; moving the request")

    async def lease_lost(self, silent_for: float) -> None:
        """Cut off from NATS or frozen past the gateways' patience: they moved these
        requests to other workers. Hand each back (in case one did not) and decode no more
        of them here."""
        await self._hand_back_all(
            f"decode worker {self.worker_id} was cut off from NATS for {silent_for:.0f}s; "
            "moving the request"
        )

    async def _hand_back_all(self, error: str) -> None:
        for request_id in self.decoding.request_ids():
            event = self.decoding.hand_back(request_id, error)  # no token may follow it
            if event is None:  # it finished meanwhile
                continue
            await self.bus.publish(subjects.tokens(request_id), event)
            self.spans.close(request_id, error=error)
            await self._abort_now(request_id)

    async def stop(self) -> None:
        self.engine_loop.stop()
        if self.receiver is not None:
            self.receiver.stop()
        if self.group is not None:
            self.group.close()
        if self.pool is not None:
            await self.pool.close()
        self.sender.close()

    # -- KV arrival ---------------------------------------------------------------------

    async def _reserve(self, msg: KVReserve) -> KVReservation:
        refusal = self._refusal(msg)
        if refusal is not None:
            return self._refuse(msg, refusal)
        prompt = msg.prompt_token_ids
        num_tokens, headroom = reservation_size(len(prompt), msg.params.max_tokens)
        reusable = reusable_blocks(len(prompt), msg.block_size, self.group is not None)
        hashes = await asyncio.to_thread(_hashes, msg, reusable * msg.block_size)
        # NOTE: the pool is asked while the engine reserves (at a step's end)
        in_pool = asyncio.ensure_future(self._pool_holds(hashes))
        reserved = await self.engine_loop.call(
            lambda e: e.reserve_reusing(msg.request_id, num_tokens, headroom, hashes)
        )
        num_pooled = await in_pool
        if reserved is None:
            return self._refuse(msg, KV_FULL)
        num_held, block_ids = reserved
        if num_pooled > num_held and self.pool_prefix is not None:  # then it is not sent
            num_held += await self.pool_prefix.fetch(
                msg.request_id, hashes[num_held:num_pooled], block_ids[num_held:num_pooled]
            )
        # NOTE: frames may land in the new blocks only: the held ones are shared
        new_blocks = block_ids[num_held:]
        problem = await self.incoming.expect(msg.request_id, new_blocks, RESERVATION_TTL, msg)
        if problem:
            await self.engine_loop.call(lambda e: e.release(msg.request_id))
            if reattach_needed(problem, self.reattaching):  # a shard died or restarted
                self.tasks.spawn(self._reattach(problem), "re-forming the attention group")
            return self._refuse(msg, attention_refusal(problem))
        shards = self.group.shards if self.group is not None else ()
        return KVReservation(
            msg.request_id, True, tuple(block_ids), self.data_addr, shards=shards, num_held=num_held
        )

    async def _pool_holds(self, hashes: list[int]) -> int:
        return 0 if self.pool_prefix is None else await self.pool_prefix.leading(hashes)

    def _refusal(self, msg: KVReserve) -> Refusal | None:
        same_layout = (
            msg.block_size == self.config.block_size and msg.namespace == self.engine.info.namespace
        )
        problem = prompt_problem(self.engine, msg.prompt_token_ids) if same_layout else ""
        return reservation_refusal(self.draining, self.reattaching, same_layout, problem)

    def _refuse(self, msg: KVReserve, refusal: Refusal) -> KVReservation:
        self.refused.labels(refusal.label).inc()
        return KVReservation(msg.request_id, False, reason=refusal.reason, code=refusal.code)

    async def _commit(self, msg: KVCommit) -> Ack:
        req = self.incoming.payload(msg.request_id)
        if req is None:
            return Ack(msg.request_id, False, "no reservation for this request (expired?)", 503)
        if not msg.ok:
            await self._release(msg.request_id)
            return Ack(msg.request_id, True)
        problem = await self.incoming.verdict(msg.request_id, msg.num_frames)
        if not problem and self.pool_prefix is not None:
            problem = await self.pool_prefix.verdict(msg.request_id)
        self.transfers.labels("refused" if problem else "ok").inc()
        tbt = current_tbt(self.engine_loop.mean_step_seconds, self.engine.has_unfinished)
        verdict = commit_verdict(problem, tbt, req.stage_tbt_slo)
        if not verdict.adopt:
            self._count_refusal(req, verdict)
            await self._release(msg.request_id)
            return verdict.ack(msg.request_id)
        self.incoming.take(msg.request_id)
        if self.pool_prefix is not None:
            self.pool_prefix.take(msg.request_id)
        self.decoding.adopt(msg.request_id)
        self.adopted_at[msg.request_id] = time.monotonic()
        self.spans.open(msg.request_id, "decode.request", _span_attributes(req, msg))
        members = self.pool.num_members() if self.pool is not None else 0
        keep = holds_kv_for_pool(members)  # to the pool at the end
        await self.engine_loop.call(
            lambda e: e.install(
                msg.request_id,
                req.prompt_token_ids,
                msg.first_token,
                req.params,
                msg.num_cached_tokens,
                hold_kv=keep,
            )
        )
        return Ack(msg.request_id, True)

    def _count_refusal(self, req: KVReserve, verdict: CommitVerdict) -> None:
        if verdict.transfer_failed:
            self.num_refused += 1
            log.warning("request %s: refusing its KV: %s", req.request_id, verdict.reason)
        if verdict.wasted:
            self.num_rejected_after_prefill += 1
            self.wasted_prefill.inc(len(req.prompt_token_ids))

    async def _release(self, request_id: str) -> None:
        # NOTE: the pool's get first: its blocks are the reservation's, freed below
        pool_safe = self.pool_prefix is None or await self.pool_prefix.drop(request_id)
        if await self.incoming.retire(request_id) and pool_safe:
            await self.engine_loop.call(lambda e: e.release(request_id))

    async def _expire_reservations(self) -> None:
        for request_id in self.incoming.expired(time.time()):
            if self.pool_prefix is not None and self.pool_prefix.owns(request_id):
                continue  # a get of a reservation's prefix: it goes with the reservation
            log.warning("request %s: KV never committed; releasing its blocks", request_id)
            await self._release(request_id)

    # -- decoding -------------------------------------------------------------------------

    def _step(self, engine: EngineInterface) -> list[RequestOutput]:
        """One engine step (engine thread); offloaded, a step that loses an attention worker
        rebuilds the group and recomputes every running request's KV there."""
        group = self.group
        if group is None:
            return engine.step()
        try:
            outputs = engine.step()
        except AttentionLost as e:
            return self._recover(engine, str(e))
        done = [out.request_id for out in outputs if out.finished]
        if done:
            group.release(done)
        return outputs

    def _recover(self, engine: EngineInterface, error: str) -> list[RequestOutput]:
        log.warning("attention group lost (%s); rebuilding it and recomputing KV", error)
        rebuilt = asyncio.run_coroutine_threadsafe(self._rebuild_group(), self.engine_loop.loop)
        try:
            num_blocks = rebuilt.result(self.config.attention_recovery_timeout + 5)
        except Exception as e:  # no group could be formed: these requests cannot go on
            log.error("attention group cannot be rebuilt: %s", e)
            return engine.fail_all(f"attention workers lost and not replaced: {e}")
        engine.recompute_all(num_blocks)
        self.recoveries.inc()
        return []

    async def _rebuild_group(self) -> int:
        """Attach the largest group of live workers that splits the KV heads evenly, waiting
        up to the recovery timeout for enough of them to answer."""
        group, incoming = self.group, self.incoming
        if group is None or not isinstance(incoming, OffloadedKV):
            raise KvstackError("this decode worker has no attention group")
        for request_id in incoming.forget_all():
            log.warning("request %s: its KV went to the lost group; refusing it", request_id)
        deadline = time.monotonic() + self.config.attention_recovery_timeout
        while True:
            live = await group.live_workers()
            size = usable_group_size(self.engine.info.model.num_kv_heads, len(live))
            problem = "no attention worker of the group answers"
            if size:
                try:
                    return await group.attach(live[:size])
                except KvstackError as e:  # e.g. one is draining away: try without it
                    problem = str(e)
            if time.monotonic() > deadline:
                raise KvstackError(problem)
            await asyncio.sleep(0.5)

    def _on_outputs(self, outputs: list[RequestOutput]) -> None:
        # NOTE: past the lease these requests belong to other workers now (fencing): their
        # tokens are not published, and the lease check hands them back.
        publish = not self.lease.expired()
        if not publish:
            self.tasks.spawn(self.check_lease(), "giving up work past the lease")
        for out in outputs:
            rid = out.request_id
            event = self.decoding.event(out)
            adopted_at = self.adopted_at.pop(rid, None)
            if event is not None and adopted_at is not None:  # its first event here
                event = dataclasses.replace(event, decode_wait=time.monotonic() - adopted_at)
            if event is not None and publish:
                self._count_tokens(event)
                if event.finished:
                    self._close_span(out, event.error)
                self.tasks.spawn(self._publish(event), f"publishing tokens of {rid}")
            if out.finished and self.pool is not None:  # held only when a pool exists
                self._write_back(self.pool, rid)

    async def _publish(self, event: TokenEvent) -> None:
        """Send a step's event, unless the lease ran out since the step: a freeze (SIGSTOP)
        between the step and this task outlasted it, and the request is another worker's."""
        if self.lease.expired():
            return
        await self.bus.publish(subjects.tokens(event.request_id), event)

    def _write_back(self, pool: KVPool, request_id: str) -> None:
        """Offer a finished request's blocks to the pool (it keeps what it lacks); they are
        freed here once sent, or at once if the write-back fails."""
        self.tasks.spawn(
            write_back(pool, self.engine_loop, request_id, f"{request_id}:turn"),
            f"writing {request_id} back to the pool",
            on_error=lambda _: self._free_held(request_id),
        )

    def _close_span(self, out: RequestOutput, error: str) -> None:
        outputs = {"gen_ai.usage.output_tokens": out.num_output_tokens}
        self.spans.close(out.request_id, outputs, error=error)

    def _count_tokens(self, event: TokenEvent) -> None:
        self.tokens_out.inc(len(event.token_ids))
        if event.finished:
            self.num_done += 1

    async def _on_abort(self, msg: Abort) -> None:
        rid = msg.request_id
        if self.incoming.payload(rid) is not None:
            await self._release(rid)
        self.adopted_at.pop(rid, None)
        if self.decoding.drop(rid):
            self.spans.close(rid, error=f"aborted: {msg.reason}")
            # NOTE: an aborted request is not written back: free its (held) blocks now.
            await self._abort_now(rid)

    def _free_held(self, request_id: str):
        return self.engine_loop.call(lambda e: e.release(request_id))

    async def _abort_now(self, request_id: str) -> None:
        await self.engine_loop.call(lambda e: self._abort(e, request_id))

    def _abort(self, engine: EngineInterface, request_id: str) -> None:
        if engine.abort(request_id):
            engine.release(request_id)
            if self.group is not None:
                self.group.release([request_id])

    async def _stats(self, _: StatsRequest) -> WorkerStats:
        stats = worker_stats(
            self.worker_id, self.engine, len(self.incoming), self.num_done, self.num_refused
        )
        from_pool = self.pool_prefix.blocks_asked if self.pool_prefix is not None else 0
        return dataclasses.replace(
            stats,
            num_rejected_after_prefill=self.num_rejected_after_prefill,
            blocks_from_kvstore=from_pool,
        )


def _span_attributes(req: KVReserve, commit: KVCommit) -> dict:
    return {
        "gen_ai.usage.input_tokens": len(req.prompt_token_ids),
        "kvstack.cached_tokens": commit.num_cached_tokens,
        "kvstack.prefill_id": req.prefill_id,
    }


def _hashes(msg: KVReserve, num_tokens: int) -> list[int]:
    """The block hashes of the prompt's first `num_tokens` tokens (off the loop: a thread)."""
    return block_hashes(msg.prompt_token_ids[:num_tokens], msg.block_size, msg.namespace)
