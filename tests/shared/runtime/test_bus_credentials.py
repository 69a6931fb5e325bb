"""Refused credentials, on a real nats-server: ones the server learns a moment later (it
was reloading its users, as `kvstack up` does when it starts a worker of a new identity)
are accepted on a later attempt; ones it never learns still end the attempt with a clear
error, within a second."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from shared.auth.deployment import Identity, ensure_secrets
from shared.errors import KvstackError
from shared.runtime.bus import AUTH_ATTEMPTS, AUTH_RETRY_S, Bus


async def test_credentials_the_server_learns_a_moment_later_are_accepted(secure_nats) -> None:
    identity = Identity("prefill", "prefill-late")
    ensure_secrets(secure_nats.secrets.dir, [identity])  # written, not yet reloaded
    auth = secure_nats.secrets.auth(identity)

    async def reload_soon() -> None:
        await asyncio.sleep(AUTH_RETRY_S / 2)  # after the first attempt was refused
        secure_nats.server.reload()

    reloading = asyncio.create_task(reload_soon())
    bus = await Bus.connect(secure_nats.url, "prefill-late", auth)
    await reloading
    await bus.drain()


async def test_credentials_never_accepted_end_the_attempt_clearly(secure_nats) -> None:
    auth = secure_nats.auth("gateway", "gateway-0")
    wrong = dataclasses.replace(auth, creds=dataclasses.replace(auth.creds, password="wrong"))
    start = time.monotonic()
    with pytest.raises(KvstackError, match="authorization violation"):
        await Bus.connect(secure_nats.url, "gateway-0", wrong)
    assert time.monotonic() - start < AUTH_ATTEMPTS * AUTH_RETRY_S + 2
