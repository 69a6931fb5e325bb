"""The gateway service: OpenAI-compatible HTTP in front, NATS behind."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from aiohttp import web

from services.gateway.app import GatewayApp
from services.gateway.backend import Backend, BackendTimeouts
from services.gateway.edge import EdgeConfig, edge_runner
from services.gateway.limits import GatewayLimits
from services.gateway.liveness import Liveness
from services.gateway.model_names import ModelNames
from services.gateway.model_routes import readiness
from services.gateway.relay import Relay
from services.gateway.timing import TTFT_STAGES, measured_parts
from services.gateway.token_source import TokenSource
from shared import subjects
from shared.engine.config import EngineConfig
from shared.engine.mock import MockSpec
from shared.engine.namespace import kv_namespace
from shared.messages import Heartbeat, Placement, RequestDone
from shared.model.config import ModelConfig
from shared.model.registry import resolve_model
from shared.model.tokenizer import Tokenizer, has_tokenizer
from shared.runtime.bus import Bus
from shared.runtime.heartbeats import subscribe_heartbeats
from shared.runtime.metrics import ITL_BUCKETS, REQUEST_LATENCY_BUCKETS, TTFT_BUCKETS
from shared.runtime.service import Service, ServiceConfig


@dataclass(frozen=True)
class GatewayConfig(ServiceConfig):
    http_port: int = 8000
    model: str = "SmolLM2-135M-Instruct"
    served_model_names: tuple[str, ...] = ()  # the first is reported; default: `model`
    api_key: str = ""
    max_tokens_limit: int = 0  # 0: the context size
    max_body_bytes: int = 4 << 20
    block_size: int = 16  # must match the workers' (for block hashes)
    dtype: str = "auto"  # the workers' dtype (names their KV blocks)
    weights: str = "auto"  # the workers' weights (name their KV blocks and decide what
    # dtype "auto" is)
    activations: str = "q16"  # the workers' activations (name their KV blocks)
    mock: MockSpec | None = None  # the workers' mock model (names their KV blocks)
    max_model_len: int = 0  # 0: the model's (the mock model's) context size
    timeouts: BackendTimeouts = BackendTimeouts()
    edge: EdgeConfig = EdgeConfig()  # HTTP timeouts, header limits, per-key limit, CORS


class GatewayService(Service):
    name = "gateway"

    def __init__(self, config: GatewayConfig) -> None:
        super().__init__(config)
        self.config: GatewayConfig = config
        model_dir = resolve_model(config.model)
        self.tokenizer = Tokenizer.from_dir(model_dir) if has_tokenizer(model_dir) else None
        model_config = ModelConfig.from_dir(model_dir)
        self.names = ModelNames.for_model(config.model, config.served_model_names, model_dir)
        self.served_model = self.names.reported
        self.model_aliases = self.names  # every name accepted, in any case
        # NOTE: named by the workers' own engine config, so that both resolve alike
        workers = EngineConfig(
            model=config.model,
            dtype=config.dtype,
            weights=config.weights,
            activations=config.activations,
        )
        self.namespace = kv_namespace(model_dir, workers.resolved_dtype, workers.kv_weights)
        if config.mock is not None:  # the workers' KV blocks and context are the mock model's
            self.namespace = config.mock.namespace
            model_config = config.mock.model_config(model_config, None)
        self.limits = GatewayLimits(
            max_model_len=config.max_model_len or model_config.max_position_embeddings,
            max_tokens_limit=config.max_tokens_limit or None,
            max_body_bytes=config.max_body_bytes,
            vocab_size=model_config.vocab_size,
        )
        self.max_body_bytes = config.max_body_bytes
        self.liveness = Liveness()  # GET /ready reads it before start() too
        self.backend: TokenSource  # set in start(): the NATS backend here
        self.app = GatewayApp(self)
        self._metrics()

    def _metrics(self) -> None:
        m = self.metrics
        self.requests = m.counter("requests", "HTTP requests by status", ("status",))
        self.inflight = m.gauge("inflight_requests", "requests being served")
        self.num_inflight = 0
        self.idle = asyncio.Event()
        self.idle.set()
        self.migrations = m.counter(
            "migrations",
            "requests placed again after tokens arrived (a worker was lost)",
            ("reason",),
        )
        self.retries = m.counter(
            "retries", "requests placed again before their first token", ("reason",)
        )
        self.ttft = m.histogram("time_to_first_token_seconds", "time to first token", TTFT_BUCKETS)
        self.itl = m.histogram("inter_token_latency_seconds", "time between tokens", ITL_BUCKETS)
        self.tpot = m.histogram(
            "request_time_per_output_token_seconds",
            "a request's mean time between its tokens after the first",
            ITL_BUCKETS,
        )
        self.e2e = m.histogram(
            "e2e_request_latency_seconds", "request latency", REQUEST_LATENCY_BUCKETS
        )
        self.ttft_stages = m.histogram(
            "ttft_stage_seconds",
            "the stages of time to first token (docs/observability.md)",
            TTFT_BUCKETS,
            ("stage",),
        )
        self.decode_first_token = m.histogram(
            "decode_first_token_seconds",
            "a decode worker's adoption of a request to its first decoded token",
            TTFT_BUCKETS,
        )

    async def start(self, bus: Bus) -> None:
        self.backend = self.nats_backend = Backend(
            bus,
            self.config.timeouts,
            self.config.block_size,
            self.namespace,
            self.liveness,
            self._on_lost,
        )
        await subscribe_heartbeats(bus, self._on_heartbeat)
        bus.on_reconnect.append(self._on_reconnect)

    async def _on_reconnect(self) -> None:
        self.nats_backend.reconnected()

    def _on_lost(self, why: str, migrated: bool) -> None:
        (self.migrations if migrated else self.retries).labels(why).inc()

    async def drain(self) -> None:
        """New requests get 503 (app.py); the ones in flight finish."""
        await self.idle.wait()

    async def abandon(self) -> None:
        """Past the drain timeout: end what is left with a clear error event."""
        self.backend.closing = True
        await self.idle.wait()

    def begin(self) -> None:
        self.num_inflight += 1
        self.inflight.inc()
        self.idle.clear()

    def end(self, relays: Sequence[Relay]) -> None:
        """A request has ended; `relays`: one per choice it generated."""
        self.num_inflight -= 1
        self.inflight.dec()
        if self.num_inflight == 0:
            self.idle.set()
        for relay in relays:
            self.observe(relay)

    async def _on_heartbeat(self, hb: Heartbeat) -> None:
        self.liveness.observe(hb)

    def readiness(self) -> tuple[bool, dict]:
        """GET /ready: whether a request can be served now, and why not."""
        return readiness(self.liveness, self.healthy())

    def routes(self) -> list[web.RouteDef]:
        return self.app.routes()

    def middlewares(self) -> list:
        return self.app.middlewares()

    def http_runner(self, app: web.Application) -> web.AppRunner:
        """The runner `shared.runtime.service` serves `app` with: the hardened edge (edge.py),
        and CORS headers on every response when origins are configured."""
        app.on_response_prepare.extend(self.app.on_response_prepare())
        return edge_runner(app, self.config.edge)

    def count_request(self, status: int) -> None:
        self.requests.labels(str(status)).inc()

    def observe(self, relay: Relay) -> None:
        """A finished request's times: into the metrics, and to the conductor."""
        first_token_at = relay.first_token_at
        if first_token_at is None:
            return
        self.observe_times(relay, first_token_at)
        self.tasks.spawn(
            self.live_bus.publish(subjects.request_done(), self._done(relay, first_token_at)),
            "publishing a finished request",
        )

    def observe_times(self, relay: Relay, first_token_at: float) -> None:
        self.ttft.observe(first_token_at - relay.started)
        times = relay.token_times
        for earlier, later in itertools.pairwise(times):
            self.itl.observe(later - earlier)
        num_tokens = relay.num_output_tokens
        if num_tokens > 1:
            self.tpot.observe((times[-1] - first_token_at) / (num_tokens - 1))
        self.e2e.observe(times[-1] - relay.started)
        self._observe_stages(relay.timing())

    def _observe_stages(self, timing: dict | None) -> None:
        if timing is None:
            return
        for stage in TTFT_STAGES:
            self.ttft_stages.labels(stage).observe(timing[stage])
        if timing["decode_first_token"]:
            self.decode_first_token.observe(timing["decode_first_token"])

    def _done(self, relay: Relay, first_token_at: float) -> RequestDone:
        """What the conductor learns output lengths and decode times from."""
        req, num_tokens = relay.req, relay.num_output_tokens
        tbt = (relay.token_times[-1] - first_token_at) / max(1, num_tokens - 1)
        predicted = _first_placement(relay) or NO_PREDICTION
        ttft = first_token_at - relay.started
        progress = relay.progress
        queue, prefill = measured_parts(ttft, progress.prefill_timing if progress else None)
        return RequestDone(
            req.request_id,
            self.nats_backend.first_block_hash(req),
            req.num_prompt_tokens,
            num_tokens,
            ttft,
            tbt,
            predicted.predicted_ttft,
            predicted.predicted_tbt,
            predicted.predicted_queue,
            predicted.predicted_prefill,
            predicted.predicted_overhead,
            queue,
            prefill,
        )


NO_PREDICTION = Placement("", accepted=False)  # predicts 0 (not known) for everything


def _first_placement(relay: Relay) -> Placement | None:
    """The placement whose predictions the request's times answer: its only one (a request
    placed again was predicted from a later start, and by other workers)."""
    progress = relay.progress
    if progress is None or progress.attempts != 1:
        return None
    return progress.placement
