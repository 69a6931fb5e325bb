"""`kvstack serve`: the gateway's OpenAI API and one engine in a single process, for one
machine. The routes, validation, streaming, errors and the gateway's metrics are the
gateway's own (`services/gateway/`); only where tokens come from differs
(`engine_backend.py`). There is no bus: no conductor, no heartbeats, nothing to place.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass

from services.colocated.engine_backend import EngineBackend
from services.gateway.relay import Relay
from services.gateway.service import GatewayConfig, GatewayService
from shared.engine.config import EngineConfig
from shared.engine.engine import LLMEngine
from shared.engine.engine_thread import EngineThread
from shared.engine.loop import EngineLoop
from shared.engine.output import RequestOutput
from shared.worker.metrics import LoadGauges, show_engine


@dataclass(frozen=True)
class ColocatedConfig:
    gateway: GatewayConfig
    engine: EngineConfig


class ColocatedService(GatewayService):
    # NOTE: named "gateway" so its metrics are the gateway's (kvstack_gateway_*): the
    # dashboards and `loadgen` read the same names from either shape of the stack.
    name = "gateway"
    needs_bus = False

    def __init__(self, config: ColocatedConfig) -> None:
        super().__init__(config.gateway)
        self.engine_config = config.engine
        self.backend = self.engine_backend = EngineBackend()
        self.engine_loop: EngineLoop | None = None
        self.load_gauges = LoadGauges.of(self.metrics)
        self.tokens_out = self.metrics.counter("generation_tokens", "tokens generated")

    async def start_alone(self) -> None:
        loop = asyncio.get_running_loop()
        thread = EngineThread()  # built where it steps: engine_thread.py says why
        engine = await thread.run(LLMEngine, self.engine_config)
        show_engine(self.metrics, engine.info)
        # NOTE: the engine's context limit is also what its KV cache holds; the gateway
        # checks prompts against it, so a 400 comes before any work.
        self.limits = dataclasses.replace(self.limits, max_model_len=engine.info.max_model_len)
        self.engine_loop = EngineLoop(
            engine, loop, self._on_outputs, self.engine_backend.step, thread
        )
        self.engine_loop.on_broken = lambda reason: self.fail(f"engine broken: {reason}")
        self.engine_loop.start()
        self.engine_backend.attach(self.engine_loop)
        self.tasks.every(1.0, self._show_load, "load gauges")

    def _on_outputs(self, outputs: list[RequestOutput]) -> None:
        self.tokens_out.inc(sum(len(out.new_token_ids) for out in outputs))
        self.engine_backend.on_outputs(outputs)

    async def _show_load(self) -> None:
        if self.engine_loop is not None:
            self.load_gauges.show(self.engine_loop.engine.stats())

    def healthy(self) -> bool:
        return self.engine_loop is not None and not self.draining

    def readiness(self) -> tuple[bool, dict]:
        ok = self.healthy()
        missing = [] if ok else ["engine" if self.engine_loop is None else "gateway"]
        body = {
            "status": "ready" if ok else "not ready",
            "workers": {"engine": int(self.engine_loop is not None)},
            "missing": missing,
        }
        return ok, body

    def observe(self, relay: Relay) -> None:
        """Its times into the metrics (there is no conductor to tell)."""
        if relay.first_token_at is not None:
            self.observe_times(relay, relay.first_token_at)

    async def abandon(self) -> None:
        self.engine_backend.end_all("the server is shutting down")
        await self.idle.wait()

    async def stop(self) -> None:
        if self.engine_loop is not None:  # joins the engine thread: off the event loop
            await asyncio.get_running_loop().run_in_executor(None, self.engine_loop.stop)
