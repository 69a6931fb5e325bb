"""What every kvstack service shares: start, heartbeat, /health and /metrics, drain, stop.

A service subclasses `Service` and fills in its own parts; `run(service)` does the rest:
connects the bus, serves HTTP, publishes heartbeats, and on SIGTERM/SIGINT drains
(stops taking work, finishes what it holds, up to a timeout) before it stops.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass

import nats.micro
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from shared import codec, subjects
from shared.bus import Bus
from shared.errors import KvstackError
from shared.messages import Heartbeat, KVResync
from shared.metrics import Metrics

log = logging.getLogger("kvstack.service")
VERSION = "0.1.0"


@dataclass(frozen=True)
class ServiceConfig:
    nats_url: str = "nats://127.0.0.1:4222"
    worker_id: str = ""              # default: <service>-<host>-<pid>
    host: str = "127.0.0.1"          # HTTP (health, metrics; the API for the gateway)
    http_port: int = 0               # 0: any free port
    heartbeat_interval: float = 1.0
    drain_timeout: float = 30.0


class Service:
    name = "service"

    def __init__(self, config: ServiceConfig) -> None:
        self.config = config
        self.worker_id = config.worker_id or f"{self.name}-{socket.gethostname()}-{os.getpid()}"
        self.metrics = Metrics(self.name.replace("-", "_"))
        self.bus: Bus | None = None
        self.http_addr = ""
        self.draining = False
        self.stopped = asyncio.Event()

    async def start(self, bus: Bus) -> None:
        """Subscribe, start workers; the bus is connected and HTTP is up."""

    def routes(self) -> list[web.RouteDef]:
        return []

    def middlewares(self) -> list:
        return []

    def heartbeat(self) -> Heartbeat:
        return Heartbeat(self.name, self.worker_id, time.time(), self.config.heartbeat_interval,
                         http_addr=self.http_addr, draining=self.draining)

    def healthy(self) -> bool:
        return self.bus is not None and self.bus.connected and not self.draining

    async def drain(self) -> None:
        """Stop taking new work and finish what is in flight."""

    async def stop(self) -> None:
        """Release everything; called after drain (or when drain timed out)."""


async def serve(service: Service, ready: asyncio.Event | None = None) -> None:
    """Run `service` until `service.stopped` is set (by a signal or by the caller)."""
    cfg = service.config
    service.bus = await Bus.connect(cfg.nats_url, service.worker_id)
    runner = await _start_http(service)
    await service.start(service.bus)
    discovery = await _register(service)
    beats = asyncio.ensure_future(_heartbeats(service))
    # NOTE: a (re)started conductor asks for resync; a beat now spares it a blind interval.
    await service.bus.subscribe(subjects.kv_resync(), lambda _: _beat(service),
                                expected=KVResync)
    log.info("%s ready: http://%s", service.worker_id, service.http_addr)
    if ready is not None:
        ready.set()
    try:
        await service.stopped.wait()
        service.draining = True
        await _bounded(service.drain(), cfg.drain_timeout, f"{service.worker_id}: drain")
    finally:
        beats.cancel()
        await _bounded(discovery.stop(), 5, f"{service.worker_id}: discovery")
        await _bounded(service.stop(), 10, f"{service.worker_id}: stop")
        await service.bus.drain()
        await runner.cleanup()


def run(service: Service) -> int:
    """Entry point of `kvstack <service>`: runs until SIGTERM or SIGINT."""
    logging.basicConfig(level=os.environ.get("KVSTACK_LOG_LEVEL", "INFO").upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, service.stopped.set)
        await serve(service)

    try:
        asyncio.run(main())
    except KvstackError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


async def _start_http(service: Service) -> web.AppRunner:
    app = web.Application(client_max_size=getattr(service, "max_body_bytes", 1 << 22),
                          middlewares=service.middlewares())
    app.add_routes([web.get("/health", _health(service)), web.get("/metrics", _metrics(service)),
                    *service.routes()])
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, service.config.host, service.config.http_port)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        raise KvstackError(f"cannot listen on {service.config.host}:"
                           f"{service.config.http_port}: {e.strerror}") from None
    port = site._server.sockets[0].getsockname()[1]
    service.http_addr = f"{service.config.host}:{port}"
    return runner


def _health(service: Service):
    async def handler(request: web.Request) -> web.Response:
        ok = service.healthy()
        body = {"status": "ok" if ok else "unavailable", "worker_id": service.worker_id}
        return web.json_response(body, status=200 if ok else 503)
    return handler


def _metrics(service: Service):
    async def handler(request: web.Request) -> web.Response:
        body = generate_latest(service.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
    return handler


async def _register(service: Service):
    """nats.micro discovery: `nats micro ls` (or $SRV.PING) lists every kvstack process."""
    micro = await nats.micro.add_service(
        service.bus.nc, name=f"kvstack-{service.name}", version=VERSION,
        description=f"kvstack {service.name}",
        metadata={"worker_id": service.worker_id, "http": service.http_addr})

    async def status(request) -> None:
        await request.respond(codec.encode(service.heartbeat()))
    await micro.add_endpoint(name="status", subject=f"kvstack.{service.name}.{service.worker_id}"
                             ".status", handler=status)
    return micro


async def _heartbeats(service: Service) -> None:
    while True:
        await _beat(service)
        await asyncio.sleep(service.config.heartbeat_interval)


async def _beat(service: Service) -> None:
    try:
        await service.bus.publish(subjects.heartbeat(service.name), service.heartbeat())
    except Exception as e:  # a NATS hiccup must not end the heartbeats
        log.warning("%s: heartbeat failed: %s", service.worker_id, e)


async def _bounded(coro, timeout: float, what: str) -> None:
    try:
        await asyncio.wait_for(coro, timeout)
    except TimeoutError:
        log.warning("%s took longer than %.0fs; going on", what, timeout)
