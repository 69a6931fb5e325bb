"""A request waits briefly for a responder that is not there yet (one reconnecting to
another NATS node) and still fails soon where nobody ever serves; real nats-server."""

from __future__ import annotations

import asyncio

import pytest

from shared.messages import Ack
from shared.runtime.bus import Bus, ServiceUnavailable


async def test_a_responder_back_within_the_grace_gets_the_request(secure_nats) -> None:
    admin = secure_nats.auth()
    client = await Bus.connect(secure_nats.url, "test-client", admin)
    server = await Bus.connect(secure_nats.url, "test-server", admin)

    async def answer(_) -> Ack:
        return Ack("r", True)

    async def serve_late() -> None:
        await asyncio.sleep(0.4)  # about a reconnection to another node
        await server.serve("kvstack.test.late", answer)
        await server.nc.flush()

    try:
        late = asyncio.create_task(serve_late())
        reply = await client.request("kvstack.test.late", Ack("r", True), 5.0, expected=Ack)
        await late
        assert reply.ok
        # NOTE: "no responder", not "no reply within 5.0s": it gave up after the grace
        with pytest.raises(ServiceUnavailable, match="no responder on kvstack"):
            await client.request("kvstack.test.nobody", Ack("r", True), 5.0)
    finally:
        await client.drain()
        await server.drain()
