"""What every kvstack service shares: start, heartbeat, /health and /metrics, drain, stop.

A service subclasses `Service` and fills in its own parts; `run(service)` does the rest:
connects the bus, serves HTTP, publishes heartbeats, and on SIGTERM/SIGINT drains before
it stops, so that `kvstack up`, `docker compose stop` and a Kubernetes rolling update all
behave the same:

1. `draining` is set and announced at once (a heartbeat): /health answers 503, the
   conductor places nothing new here, new work is refused with a retryable 503.
2. `drain()` finishes what the service holds, up to `--drain-timeout`; past it,
   `abandon()` hands off or ends what is left (each request with a clear error).
3. A last heartbeat with `stopped` deregisters it; then `stop()`, then the bus closes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
import time
import uuid
from dataclasses import dataclass, replace

import nats.micro
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, Info, generate_latest

from shared import codec, subjects
from shared.auth.credentials import NatsAuth
from shared.errors import KvstackError
from shared.messages import Heartbeat, KVResync
from shared.runtime import tracing
from shared.runtime.bus import Bus
from shared.runtime.heartbeats import BusLease
from shared.runtime.metrics import Metrics
from shared.runtime.tasks import Tasks

log = logging.getLogger("kvstack.service")
VERSION = "0.1.0"


@dataclass(frozen=True)
class ServiceConfig:
    nats_url: str = "nats://127.0.0.1:4222"
    worker_id: str = ""  # default: <service>-<host>-<pid>
    host: str = "127.0.0.1"  # HTTP (health, metrics; the API for the gateway)
    http_port: int = 0  # 0: any free port
    heartbeat_interval: float = 1.0
    drain_timeout: float = 30.0
    otlp_endpoint: str = ""  # an OTLP/HTTP collector's base URL: tracing on ("": off)
    nats_auth: NatsAuth = NatsAuth()  # credentials; none (refused) unless insecure


class Service:
    name = "service"
    # NOTE: False for a process that is the whole stack (`kvstack serve`): no bus, no
    # heartbeats, no discovery; `start_alone` instead of `start`.
    needs_bus = True

    def __init__(self, config: ServiceConfig) -> None:
        self.config = config
        self.worker_id = config.worker_id or _default_worker_id(self.name)
        if not subjects.WORKER_ID.fullmatch(self.worker_id):
            raise KvstackError(
                f"worker id {self.worker_id!r}: use letters, digits, '-' and "
                "'_' only (it is a NATS subject token)"
            )
        self.metrics = Metrics(self.name.replace("-", "_"))
        # NOTE: names each scrape target: dashboards join it to show worker ids, not ports
        Info(
            "kvstack_worker", "this process's service and worker id", registry=self.metrics.registry
        ).info({"service": self.name, "worker_id": self.worker_id, "version": VERSION})
        self.instance = uuid.uuid4().hex[:12]
        self.tasks = Tasks(self.worker_id)
        self.bus: Bus | None = None
        self.http_addr = ""
        self.draining = False
        self.started = False  # start() returned: the service does its work (GET /ready)
        self.lease = BusLease(config.heartbeat_interval)
        self.fenced = False  # its lease ran out: it gave up its work; until renewed
        self.leaving = False  # the last beat is out: peers forget this worker
        self.exit_code = 0
        self.stopped = asyncio.Event()

    async def start(self, bus: Bus) -> None:
        """Subscribe, start workers; the bus is connected and HTTP is up."""

    async def start_alone(self) -> None:
        """Start without a bus (`needs_bus` False); HTTP is up."""

    def routes(self) -> list[web.RouteDef]:
        return []

    def middlewares(self) -> list:
        return []

    def heartbeat(self) -> Heartbeat:
        return Heartbeat(
            self.name,
            self.worker_id,
            time.time(),
            self.config.heartbeat_interval,
            http_addr=self.http_addr,
            draining=self.draining,
        )

    def beat_now(self) -> None:
        """Publish a heartbeat at once, outside the interval: the load just fell (a
        prefill ended), and the conductor should not count it until the next beat."""
        if self.bus is not None and not self.leaving:
            self.tasks.spawn(_beat(self), "an early heartbeat")

    @property
    def live_bus(self) -> Bus:
        """The bus, for what runs once `run` connected it (handlers, tasks, heartbeats)."""
        if self.bus is None:
            raise RuntimeError(f"{self.worker_id}: the bus is not connected yet")
        return self.bus

    def healthy(self) -> bool:
        return self.bus is not None and self.bus.connected and not self.draining

    def ready(self) -> bool:
        """Started and healthy: what GET /ready answers (a container's health check)."""
        return self.started and self.healthy()

    async def drain(self) -> None:
        """Finish what is in flight (new work is refused while `draining`)."""

    async def abandon(self) -> None:
        """The drain timed out: hand off or end, each with a clear error, what is left."""

    async def lease_lost(self, silent_for: float) -> None:
        """Cut off from NATS (or frozen) for `silent_for` seconds, longer than peers wait:
        they have moved its work elsewhere. Give that work up without another token."""

    async def check_lease(self) -> None:
        """Give the work up once, when the lease has run out (see `lease_lost`)."""
        if self.lease.expired() and not self.fenced:
            self.fenced = True
            silent_for = self.lease.silent_for()
            log.warning(
                "%s: no heartbeat reached NATS for %.1fs: peers gave this worker up; "
                "giving up what it held",
                self.worker_id,
                silent_for,
            )
            await self.lease_lost(silent_for)

    async def stop(self) -> None:
        """Release everything; called after drain (or when drain timed out)."""

    def fail(self, reason: str, exit_code: int = 70) -> None:
        """Stop this process with a non-zero exit code (a supervisor restarts it)."""
        log.error("%s: stopping: %s", self.worker_id, reason)
        self.exit_code = exit_code
        self.stopped.set()


async def serve(service: Service, ready: asyncio.Event | None = None) -> None:
    """Run `service` until `service.stopped` is set (by a signal or by the caller)."""
    if not service.needs_bus:
        await _serve_alone(service, ready)
        return
    cfg = service.config
    service.bus = await Bus.connect(cfg.nats_url, service.worker_id, cfg.nats_auth)
    runner = await _start_http(service)
    await service.start(service.bus)
    service.started = True
    discovery = await _register(service)
    await _hear_own_beats(service)
    beats = service.tasks.every(cfg.heartbeat_interval, lambda: _beat(service), "heartbeats")
    # NOTE: a (re)started conductor asks for resync; a beat now spares it a blind interval.
    await service.bus.subscribe(subjects.kv_resync(), lambda _: _beat(service), expected=KVResync)
    service.bus.on_reconnect.append(lambda: _beat(service))
    await _beat(service)
    log.info("%s ready: http://%s", service.worker_id, service.http_addr)
    if ready is not None:
        ready.set()
    try:
        await service.stopped.wait()
        await _drain(service)
    finally:
        beats.cancel()
        await _bounded(discovery.stop(), 5, f"{service.worker_id}: discovery")
        await _bounded(service.stop(), 10, f"{service.worker_id}: stop")
        service.tasks.cancel()
        await service.bus.drain()
        await runner.cleanup()


async def _serve_alone(service: Service, ready: asyncio.Event | None) -> None:
    """`serve` for a service without a bus: HTTP first (a taken port fails at once),
    then its start; a signal drains it."""
    runner = await _start_http(service)
    try:
        await service.start_alone()
        service.started = True
        log.info("%s ready: http://%s", service.worker_id, service.http_addr)
        if ready is not None:
            ready.set()
        await service.stopped.wait()
        await _drain(service)
    finally:
        await _bounded(service.stop(), 10, f"{service.worker_id}: stop")
        service.tasks.cancel()
        await runner.cleanup()


async def _drain(service: Service) -> None:
    """Refuse new work, finish (or hand off) what is held, then deregister."""
    service.draining = True
    await _beat(service)  # the conductor stops placing here now, not a beat later
    log.info("%s draining (up to %.0fs)", service.worker_id, service.config.drain_timeout)
    done = await _bounded(
        service.drain(), service.config.drain_timeout, f"{service.worker_id}: drain"
    )
    if not done:
        await _bounded(service.abandon(), 10, f"{service.worker_id}: hand-off")
    service.leaving = True
    await _beat(service)


def run(service: Service) -> int:
    """Entry point of `kvstack <service>`: runs until SIGTERM or SIGINT."""
    logging.basicConfig(
        level=os.environ.get("KVSTACK_LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, _on_signal, service)
        await serve(service)

    try:
        if service.config.otlp_endpoint:
            tracing.start(service.name, service.config.otlp_endpoint, service.worker_id)
        asyncio.run(main())
    except KvstackError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        tracing.stop()  # the spans still batched go out (the loop is done: it may block)
    return service.exit_code


def _on_signal(service: Service) -> None:
    """The first SIGTERM/SIGINT drains; a second one stops at once."""
    if not service.stopped.is_set():
        service.stopped.set()
        return
    log.warning("%s: second signal; stopping without finishing the drain", service.worker_id)
    logging.shutdown()
    os._exit(1)


async def _start_http(service: Service) -> web.AppRunner:
    app = web.Application(
        client_max_size=getattr(service, "max_body_bytes", 1 << 22),
        middlewares=service.middlewares(),
    )
    own = service.routes()
    ready = (
        []
        if any(getattr(r, "path", "") == "/ready" for r in own)
        else [web.get("/ready", _ready(service))]
    )
    app.add_routes(
        [
            web.get("/health", _health(service)),
            web.get("/metrics", _metrics(service)),
            *ready,  # a service may answer /ready its own way (the gateway does)
            *own,
        ]
    )
    # NOTE: a service facing the public (the gateway) hardens its edge: timeouts, header
    # limits, CORS; see services/gateway/edge.py.
    if hasattr(service, "http_runner"):
        runner = service.http_runner(app)
    else:
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, service.config.host, service.config.http_port)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        raise KvstackError(
            f"cannot listen on {service.config.host}:{service.config.http_port}: {e.strerror}"
        ) from None
    port = runner.addresses[0][1]  # the one actually bound (http_port may be 0)
    service.http_addr = f"{service.config.host}:{port}"
    return runner


def _health(service: Service):
    return _status(service, service.healthy, ("ok", "unavailable"))


def _ready(service: Service):
    return _status(service, service.ready, ("ready", "not ready"))


def _status(service: Service, check, words: tuple[str, str]):
    """A GET handler: 200 and words[0] while `check()` holds, else 503 and words[1]."""

    async def handler(request: web.Request) -> web.Response:
        ok = check()
        body = {"status": words[0] if ok else words[1], "worker_id": service.worker_id}
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
        service.live_bus.nc,
        name=f"kvstack-{service.name}",
        version=VERSION,
        description=f"kvstack {service.name}",
        metadata={"worker_id": service.worker_id, "http": service.http_addr},
    )

    async def status(request) -> None:
        await request.respond(codec.encode(service.heartbeat()))

    await micro.add_endpoint(
        name="status", subject=f"kvstack.{service.name}.{service.worker_id}.status", handler=status
    )
    return micro


async def _beat(service: Service) -> None:
    if not service.needs_bus:
        return
    bus = service.live_bus
    beat = replace(
        service.heartbeat(),
        instance=service.instance,
        stopped=service.leaving,
        reconnections=bus.reconnections,
    )
    await service.check_lease()
    try:
        await bus.publish(subjects.heartbeat(service.name, service.worker_id), beat)
    except Exception as e:  # a NATS hiccup must not end the heartbeats
        log.warning("%s: heartbeat failed: %s", service.worker_id, e)


async def _hear_own_beats(service: Service) -> None:
    """The lease on the bus: renewed each time one of this process's own heartbeats comes
    back through NATS, when its peers hear it too (shared/runtime/heartbeats.py: BusLease)."""

    async def on_beat(beat: Heartbeat) -> None:
        if beat.instance != service.instance:
            return
        # NOTE: as of when it was sent (this process's own clock): a beat that reached
        # NATS just before a freeze and waited it out in this socket's buffer says
        # nothing about now, and must not unfence a worker thawed past its lease
        service.lease.renew(time.monotonic() - max(0.0, time.time() - beat.time))
        service.fenced = service.fenced and service.lease.expired()

    subject = subjects.heartbeat(service.name, service.worker_id)
    await service.live_bus.subscribe(subject, on_beat, expected=Heartbeat)


def _default_worker_id(service: str) -> str:
    host = "".join(c if c.isalnum() or c in "-_" else "-" for c in socket.gethostname())
    return f"{service}-{host[:64]}-{os.getpid()}"


async def _bounded(coro, timeout: float, what: str) -> bool:
    """Whether `coro` finished within `timeout` seconds."""
    try:
        await asyncio.wait_for(coro, timeout)
    except TimeoutError:
        log.warning("%s took longer than %.0fs; going on", what, timeout)
        return False
    return True
