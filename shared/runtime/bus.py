"""The control bus: typed messages over NATS (nats-py), with errors a caller can act on."""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from shared import codec, subjects
from shared.auth.credentials import NatsAuth
from shared.errors import KvstackError
from shared.messages import Ack
from shared.runtime import tracing
from shared.runtime.tasks import Tasks

log = logging.getLogger("kvstack.bus")

Handler = Callable[[Any], Awaitable[None]]
Responder = Callable[[Any], Awaitable[Any]]
NATS_SCHEMES = ("nats", "tls", "ws", "wss")
RECONNECT_WAIT = 0.5  # seconds before a server just tried is tried again
AUTH_ATTEMPTS, AUTH_RETRY_S = 3, 0.25  # refused credentials: tried again (see _open_retrying)
PING_INTERVAL_S = 5  # seconds between the client's pings to its server
MAX_OUTSTANDING_PINGS = 3  # unanswered pings after which the connection is stale
NO_RESPONDER_GRACE = 1.0  # seconds a request waits for a responder that is reconnecting
NO_RESPONDER_RETRY_S = 0.1


class ServiceUnavailable(KvstackError):
    """Nobody serves the subject (no worker of that kind is up), or it timed out."""


class Bus:
    def __init__(self, nc: Client, name: str) -> None:
        self.nc = nc
        self.name = name
        self.tasks = Tasks(name)
        # NOTE: heartbeats carry it: what this process published just before a
        # reconnection may be lost (NATS core is at most once), and a gateway waiting for
        # those messages learns it from here.
        self.reconnections = 0
        # Called after each reconnection: messages published meanwhile may be lost, so a
        # service re-announces itself or re-checks what it waits for.
        self.on_reconnect: list[Callable[[], Awaitable[None]]] = []

    @classmethod
    async def connect(
        cls, url: str, name: str, auth: NatsAuth = NatsAuth(), connect_timeout: float = 5.0
    ) -> Bus:
        """Connect with `auth`'s credentials; refuse a bus that lets anyone in unless
        `auth.insecure` (an open bus hands every prompt to whoever connects). `url` may
        name several servers, comma-separated (every node of a cluster): the client
        connects to one and, when it goes, reconnects to another."""
        auth.check(name)
        server_urls(url)  # a clear error before any attempt
        bus: Bus | None = None

        async def reconnected() -> None:
            log.info("%s: NATS reconnected", name)
            if bus is None:  # reconnected before connect() returned: nothing to announce yet
                return
            bus.reconnections += 1
            for callback in bus.on_reconnect:
                bus.tasks.spawn(callback(), "re-announcing after a reconnection")

        nc = await _open_retrying(url, name, auth, connect_timeout, reconnected)
        if not auth.insecure and not nc._server_info.get("auth_required"):
            await nc.close()
            raise KvstackError(
                f"the NATS server at {url} accepts clients without credentials: anyone who "
                "reaches it can read prompts and pose as a worker. Start it with the config "
                "that `kvstack up` or `kvstack auth init` writes, or pass --insecure"
            )
        bus = cls(nc, name)
        return bus

    @property
    def connected(self) -> bool:
        return self.nc.is_connected

    async def publish(self, subject: str, msg: Any, parent: Any = None) -> None:
        """Send `msg`; with tracing on it carries the current trace, or `parent`'s (a span)."""
        await self.nc.publish(subject, codec.encode(msg), headers=tracing.headers(parent))

    async def request(
        self,
        subject: str,
        msg: Any,
        timeout: float,
        expected: type | tuple[type, ...] | None = None,
        parent: Any = None,
    ) -> Any:
        """Send and wait for the reply; ServiceUnavailable if nobody answers in time. The
        trace goes with it as with `publish`."""
        data, headers = codec.encode(msg), tracing.headers(parent)
        try:
            reply = await self._request(subject, data, timeout, headers)
        except NoRespondersError:
            raise ServiceUnavailable(f"no responder on {subject}") from None
        except (TimeoutError, NatsTimeout):
            raise ServiceUnavailable(f"no reply on {subject} within {timeout:.1f}s") from None
        return codec.decode(reply.data, expected)

    async def _request(self, subject: str, data: bytes, timeout: float, headers) -> Msg:
        """nats-py's request, asked again while nobody responds, for up to
        NO_RESPONDER_GRACE of `timeout`."""
        # NOTE: a responder whose NATS server (a cluster node) died is back on another
        # node within about RECONNECT_WAIT; a request in that window finds no responder,
        # and its caller would count a live worker as lost.
        started = time.monotonic()
        while True:
            left = timeout - (time.monotonic() - started)
            try:
                return await self.nc.request(subject, data, timeout=left, headers=headers)
            except NoRespondersError:
                waited = time.monotonic() - started
                if waited + NO_RESPONDER_RETRY_S > min(timeout, NO_RESPONDER_GRACE):
                    raise
                await asyncio.sleep(NO_RESPONDER_RETRY_S)

    async def subscribe(
        self,
        subject: str,
        handler: Handler,
        queue: str = "",
        expected: type | tuple[type, ...] | None = None,
        sender: Callable[[Any], str] | None = None,
    ):
        """Run `handler` on each decodable message, each in its own task (in the trace the
        message carries, if any).

        With `sender`, a message whose `sender(message)` is not the worker id its subject
        ends with is dropped: a worker may speak only for itself (permissions let it
        publish only under its own id)."""

        async def on_msg(msg: Msg) -> None:
            decoded = self._decode(msg, expected)
            if decoded is not None and self._speaks_for_itself(msg, decoded, sender):
                self._spawn(handler(decoded), msg)

        return await self.nc.subscribe(subject, queue=queue, cb=on_msg)

    async def serve(
        self,
        subject: str,
        responder: Responder,
        queue: str = "",
        expected: type | tuple[type, ...] | None = None,
    ):
        """Answer requests: the responder's return value is the reply.

        The responder runs in the trace the request carries, if any. A request that does
        not decode is answered with an Ack(ok=False, code=400), and a responder that
        raises with code 500: the caller never waits for a reply that will not come.
        """

        async def on_msg(msg: Msg) -> None:
            self._spawn(self._respond(msg, responder, expected), msg)

        return await self.nc.subscribe(subject, queue=queue, cb=on_msg)

    async def drain(self, timeout: float = 5.0) -> None:
        """Finish handlers, flush, close. With NATS gone there is nothing to flush: close."""
        await self.tasks.wait(timeout)
        if self.nc.is_closed:
            return
        if not self.nc.is_connected:
            return await self.nc.close()
        try:
            await asyncio.wait_for(self.nc.drain(), timeout)
        except (TimeoutError, Exception):
            await self.nc.close()

    async def _respond(self, msg: Msg, responder: Responder, expected) -> None:
        try:
            request = codec.decode(msg.data, expected)
        except codec.MessageError as e:
            return await msg.respond(codec.encode(Ack("", False, str(e), 400)))
        try:
            reply = await responder(request)
        except KvstackError as e:
            reply = Ack(getattr(request, "request_id", ""), False, str(e), 400)
        except Exception as e:  # a bug must not leave the caller hanging
            log.exception("%s: handler for %s failed", self.name, msg.subject)
            reply = Ack(getattr(request, "request_id", ""), False, f"internal error: {e}", 500)
        if msg.reply:
            await msg.respond(codec.encode(reply))

    def _decode(self, msg: Msg, expected) -> Any:
        try:
            return codec.decode(msg.data, expected)
        except codec.MessageError as e:
            log.warning("%s: dropped a bad message on %s: %s", self.name, msg.subject, e)
            return None

    def _speaks_for_itself(self, msg: Msg, decoded: Any, sender) -> bool:
        if sender is None or sender(decoded) == subjects.sender_of(msg.subject):
            return True
        log.warning(
            "%s: dropped a message on %s that speaks for %r",
            self.name,
            msg.subject,
            sender(decoded),
        )
        return False

    def _spawn(self, coro: Awaitable[None], msg: Msg) -> None:
        with tracing.received(msg.headers):  # the task starts in the message's trace
            self.tasks.spawn(coro, "a message handler")


class _CredentialsRefused(KvstackError):
    """NATS refused the credentials: wrong, or the server was reloading its users."""


async def _open_retrying(
    url: str, name: str, auth: NatsAuth, connect_timeout: float, reconnected
) -> Client:
    """`_open`, with refused credentials tried again a few times: a server reloading its
    users (as `kvstack up` does when it starts a worker of a new identity) refuses, for a
    moment, clients it knows (nats-server logs an authentication error mid-reload)."""
    for attempt in range(1, AUTH_ATTEMPTS + 1):
        try:
            return await _open(url, name, auth, connect_timeout, reconnected)
        except _CredentialsRefused:
            if attempt == AUTH_ATTEMPTS:
                raise
            await asyncio.sleep(AUTH_RETRY_S)
    raise AssertionError("unreachable")


async def _open(url: str, name: str, auth: NatsAuth, connect_timeout: float, reconnected) -> Client:
    """A connected client. NATS refusing the credentials ends the attempt at once (nats-py
    would retry them forever); an unreachable server is reported as before."""
    nc, refused = Client(), asyncio.get_running_loop().create_future()

    async def on_error(e: Exception) -> None:
        if _refusal(e) and not refused.done():
            refused.set_result(e)
        await _log_error(e)

    connecting = asyncio.ensure_future(
        nc.connect(
            server_urls(url),
            name=name,
            # NOTE: nats-py annotates these two int, but only hands them to asyncio's
            # timeouts and sleeps, which take fractions of seconds.
            connect_timeout=connect_timeout,  # type: ignore[arg-type]
            max_reconnect_attempts=-1,
            reconnect_time_wait=RECONNECT_WAIT,  # type: ignore[arg-type]
            allow_reconnect=True,
            # NOTE: a link cut silently (a partition drops packets, nothing resets them)
            # is found by unanswered pings: with nats-py's 2 minutes x 2 a client stayed on
            # a node cut off from the rest for 4 minutes; now 15-20 s, then another node.
            ping_interval=PING_INTERVAL_S,
            max_outstanding_pings=MAX_OUTSTANDING_PINGS,
            error_cb=on_error,
            disconnected_cb=_log_event(f"{name}: NATS disconnected"),
            reconnected_cb=reconnected,
            **auth.connect_options(),
        )
    )
    await asyncio.wait({connecting, refused}, return_when=asyncio.FIRST_COMPLETED)
    if not connecting.done():
        connecting.cancel()
        await nc.close()
        user = auth.creds.user if auth.creds is not None else "an anonymous client"
        reason = _refusal(refused.result())
        error = _CredentialsRefused if reason.startswith("authorization") else KvstackError
        raise error(f"NATS at {url} refused {user}: {reason}")
    try:
        connecting.result()
    except Exception as e:
        raise KvstackError(f"cannot reach NATS at {url}: {type(e).__name__} {e}") from None
    return nc


def server_urls(urls: str) -> list[str]:
    """The NATS servers `urls` names: one URL, or several comma-separated."""
    servers = [u.strip() for u in urls.split(",") if u.strip()]
    if not servers:
        raise KvstackError("no NATS server URL (--nats, KVSTACK_NATS)")
    bad = [server for server in servers if not _valid_url(server)]
    if bad:
        raise KvstackError(
            f"bad NATS server URL {bad[0]!r} in {urls!r}: expected e.g. nats://host:4222, "
            "several separated by commas"
        )
    return servers


def _valid_url(server: str) -> bool:
    parts = urlsplit(server if "://" in server else f"nats://{server}")
    try:
        _ = parts.port  # NOTE: raises on a port that is no number or out of range
    except ValueError:
        return False
    return parts.scheme in NATS_SCHEMES and bool(parts.hostname)


def _refusal(e: Exception) -> str:
    """Why a first connection can never succeed as configured ("" if it may)."""
    if "authorization violation" in str(e).lower():
        return (
            "authorization violation (wrong or rotated credentials, or none where the "
            "server requires them)"
        )
    if isinstance(e, ssl.SSLCertVerificationError):
        return (
            f"its TLS certificate is not trusted ({e.verify_message}); pass the "
            "deployment's CA with --nats-tls-ca"
        )
    if "tls" in str(e).lower() and "required" in str(e).lower():
        return f"{e}; pass the deployment's CA with --nats-tls-ca"
    return ""


async def _log_error(e: Exception) -> None:
    log.warning("NATS error: %s", e)


def _log_event(text: str):
    async def callback() -> None:
        log.info(text)

    return callback
