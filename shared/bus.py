"""The control bus: typed messages over NATS (nats-py), with errors a caller can act on."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from shared import codec
from shared.errors import KvstackError
from shared.messages import Ack
from shared.tasks import Tasks

log = logging.getLogger("kvstack.bus")

Handler = Callable[[Any], Awaitable[None]]
Responder = Callable[[Any], Awaitable[Any]]


class ServiceUnavailable(KvstackError):
    """Nobody serves the subject (no worker of that kind is up), or it timed out."""


class Bus:
    def __init__(self, nc: Client, name: str) -> None:
        self.nc = nc
        self.name = name
        self.tasks = Tasks(name)
        # Called after each reconnection: messages published meanwhile may be lost, so a
        # service re-announces itself or re-checks what it waits for.
        self.on_reconnect: list[Callable[[], Awaitable[None]]] = []

    @classmethod
    async def connect(cls, url: str, name: str, connect_timeout: float = 5.0) -> Bus:
        bus: Bus | None = None

        async def reconnected() -> None:
            log.info("%s: NATS reconnected", name)
            for callback in bus.on_reconnect if bus is not None else ():
                bus.tasks.spawn(callback(), "re-announcing after a reconnection")
        try:
            nc = await nats.connect(
                url, name=name, connect_timeout=connect_timeout, max_reconnect_attempts=-1,
                reconnect_time_wait=0.5, allow_reconnect=True, error_cb=_log_error,
                disconnected_cb=_log_event(f"{name}: NATS disconnected"),
                reconnected_cb=reconnected)
        except Exception as e:
            raise KvstackError(f"cannot reach NATS at {url}: {type(e).__name__} {e}") from None
        bus = cls(nc, name)
        return bus

    @property
    def connected(self) -> bool:
        return self.nc.is_connected

    async def publish(self, subject: str, msg: Any) -> None:
        await self.nc.publish(subject, codec.encode(msg))

    async def request(self, subject: str, msg: Any, timeout: float,
                      expected: type | tuple[type, ...] | None = None) -> Any:
        """Send and wait for the reply; ServiceUnavailable if nobody answers in time."""
        try:
            reply = await self.nc.request(subject, codec.encode(msg), timeout=timeout)
        except NoRespondersError:
            raise ServiceUnavailable(f"no responder on {subject}") from None
        except (NatsTimeout, asyncio.TimeoutError):
            raise ServiceUnavailable(f"no reply on {subject} within {timeout:.1f}s") from None
        return codec.decode(reply.data, expected)

    async def subscribe(self, subject: str, handler: Handler, queue: str = "",
                        expected: type | tuple[type, ...] | None = None):
        """Run `handler` on each decodable message, each in its own task."""
        async def on_msg(msg: Msg) -> None:
            decoded = self._decode(msg, expected)
            if decoded is not None:
                self._spawn(handler(decoded))
        return await self.nc.subscribe(subject, queue=queue, cb=on_msg)

    async def serve(self, subject: str, responder: Responder, queue: str = "",
                    expected: type | tuple[type, ...] | None = None):
        """Answer requests: the responder's return value is the reply.

        A request that does not decode is answered with an Ack(ok=False, code=400), and a
        responder that raises with code 500: the caller never waits for a reply that
        will not come.
        """
        async def on_msg(msg: Msg) -> None:
            self._spawn(self._respond(msg, responder, expected))
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
        except (asyncio.TimeoutError, Exception):
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

    def _spawn(self, coro: Awaitable[None]) -> None:
        self.tasks.spawn(coro, "a message handler")


async def _log_error(e: Exception) -> None:
    log.warning("NATS error: %s", e)


def _log_event(text: str):
    async def callback() -> None:
        log.info(text)
    return callback
