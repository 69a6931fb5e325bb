"""The control bus is closed to strangers: a real nats-server started with the config the
stack generated (per-service users and permissions), real services, real clients."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from dataclasses import replace

import nats
import pytest

from services.stack.stack import Stack
from shared import codec, subjects
from shared.auth.credentials import NatsAuth
from shared.auth.deployment import Identity, ensure_secrets
from shared.errors import KvstackError
from shared.messages import Heartbeat, KVEvent
from shared.runtime.bus import Bus
from shared.runtime.nats_server import NatsServer
from tests.e2e.conftest import ask_conductor


def auth_of(stack: Stack, role: str, worker: str) -> NatsAuth:
    return stack.auth.secrets.auth(Identity(role, worker))


async def violations(url: str, auth: NatsAuth, act) -> list[str]:
    """What nats-server refused while `act(client)` ran."""
    errors: list[str] = []

    async def on_error(e: Exception) -> None:
        errors.append(str(e))

    nc = await nats.connect(url, error_cb=on_error, allow_reconnect=False, **auth.connect_options())
    try:
        await act(nc)
        await nc.flush()
        await asyncio.sleep(0.3)
    finally:
        await nc.close()
    return errors


def beat(worker_id: str, service: str = "prefill", **fields) -> bytes:
    return codec.encode(replace(Heartbeat(service, worker_id, time.time(), 1.0), **fields))


async def test_an_anonymous_client_is_refused(stack) -> None:
    with pytest.raises(KvstackError, match="refused an anonymous client"):
        await Bus.connect(stack.nats_url, "stranger", NatsAuth(insecure=True), 2.0)
    with pytest.raises(Exception, match="Authorization Violation"):
        await nats.connect(stack.nats_url, allow_reconnect=False, connect_timeout=2)


async def test_the_gateway_cannot_beat_for_a_worker_or_read_kv_events(stack) -> None:
    async def act(nc) -> None:
        await nc.publish(subjects.heartbeat("prefill", "prefill-0"), beat("prefill-0"))
        await nc.subscribe(subjects.all_kv_events())
        await nc.publish(subjects.prefill_get("prefill-0"), b"{}")  # a worker's own request
        await nc.publish(subjects.request_done(), b"{}")  # its own: allowed
        await nc.subscribe(subjects.tokens("some-request"))  # its own: allowed

    refused = await violations(stack.nats_url, auth_of(stack, "gateway", "gateway-0"), act)
    assert len(refused) == 3, refused
    assert any("publish" in e and "heartbeat.prefill" in e for e in refused)
    assert any("subscription" in e and "kv_events" in e for e in refused)


async def test_a_worker_can_speak_only_for_itself(stack) -> None:
    async def act(nc) -> None:
        await nc.publish(subjects.heartbeat("prefill", "prefill-9"), beat("prefill-9"))
        await nc.publish(subjects.kv_events("kvstore-0"), b"{}")
        await nc.subscribe(subjects.prefill_submit("prefill-9"))  # steal another's work
        await nc.subscribe(subjects.tokens("some-request"))  # read users' answers
        await nc.publish(subjects.place(), b"{}")  # skip the gateway's key
        await nc.publish(subjects.abort(), b"{}")  # abort users' requests
        await nc.publish(subjects.heartbeat("prefill", "prefill-0"), beat("prefill-0"))

    refused = await violations(stack.nats_url, auth_of(stack, "prefill", "prefill-0"), act)
    assert len(refused) == 6, refused


async def test_a_message_that_names_another_worker_than_its_subject_is_dropped(stack) -> None:
    admin = stack.auth.admin()  # even with every permission

    async def act(nc) -> None:
        await nc.publish(subjects.heartbeat("prefill", "prefill-0"), beat("prefill-evil"))
        await nc.publish(
            subjects.kv_events("prefill-0"),
            codec.encode(KVEvent("prefill-evil", "prefill", stored=(1, 2))),
        )

    assert await violations(stack.nats_url, admin, act) == []
    await asyncio.sleep(0.5)
    stats = await ask_conductor(stack)
    assert "prefill-evil" not in stats.live_prefill and "prefill-0" in stats.live_prefill


async def test_a_beat_dated_in_the_future_keeps_no_dead_worker_alive(stack) -> None:
    """A worker that beat once, dated an hour ahead, is dead 3 intervals after the conductor
    heard it: liveness runs on the conductor's clock, not the sender's."""

    async def act(nc) -> None:
        await nc.publish(
            subjects.heartbeat("prefill", "prefill-ghost"),
            beat("prefill-ghost", time=time.time() + 3600, instance="ghost"),
        )

    assert await violations(stack.nats_url, stack.auth.admin(), act) == []
    await asyncio.sleep(0.5)
    assert "prefill-ghost" in (await ask_conductor(stack)).live_prefill
    await asyncio.sleep(3.5)
    assert "prefill-ghost" not in (await ask_conductor(stack)).live_prefill


def kvstack(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "services.cli.main", *args],
        text=True,
        capture_output=True,
        timeout=120,
        env=env,
    )


def test_a_service_refuses_an_open_bus_or_missing_credentials(tmp_path) -> None:
    open_bus = NatsServer(tmp_path / "nats")
    secrets = ensure_secrets(tmp_path / "secrets", [Identity("conductor")])
    try:
        creds = str(secrets.creds_path(Identity("conductor")))
        run = kvstack("conductor", "--nats", open_bus.url, "--nats-creds", creds)
        assert run.returncode == 2 and "accepts clients without credentials" in run.stderr
        run = kvstack("conductor", "--nats", open_bus.url)
        assert run.returncode == 2 and "needs NATS credentials" in run.stderr
        run = kvstack("kvstore", "--nats", open_bus.url, "--nats-creds", creds)
        assert run.returncode == 2 and "data plane needs a shared secret" in run.stderr
    finally:
        open_bus.stop()


async def test_nats_over_tls_with_the_deployments_own_ca(tmp_path) -> None:
    secrets = ensure_secrets(tmp_path / "secrets", [Identity("gateway")], tls=True)
    server = NatsServer(tmp_path / "nats", config=secrets.server_config)
    try:
        gateway = secrets.auth(Identity("gateway"))
        bus = await Bus.connect(server.url, "tls-client", gateway)
        assert bus.nc.connected_url is not None and bus.connected
        await bus.drain()
        with pytest.raises(KvstackError):  # a server certificate nobody vouches for
            await Bus.connect(server.url, "no-ca", replace(gateway, tls_ca=""), 2.0)
    finally:
        server.stop()
