"""The conductor lease on NATS JetStream key-value: claim, renew, release (the I/O around
shared/conductor/lease.py, which decides; docs/conductor.md, "Failover")."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig
from nats.js.errors import KeyWrongLastSequenceError, NotFoundError
from nats.js.kv import KeyValue

from shared import subjects
from shared.conductor.lease import Lease
from shared.errors import KvstackError

log = logging.getLogger("kvstack.conductor.lease")
KEY = "active"

OnChange = Callable[[bool], Awaitable[None]]


async def open_bucket(js: JetStreamContext, config: KeyValueConfig) -> KeyValue:
    """The bucket, made if missing; one made by a peer with other settings is an error
    (two conductors with different --lease-ttl would not agree on who is active)."""
    try:
        return await js.create_key_value(config)
    except NatsError:
        kv = await js.key_value(config.bucket)
    status = await kv.status()
    if status.ttl != config.ttl:
        raise KvstackError(
            f"JetStream bucket {config.bucket} keeps keys {status.ttl}s, this "
            f"conductor wants {config.ttl}s: give every conductor the same --lease-ttl"
        )
    return kv


class LeaseKeeper:
    """Claims the lease while standing by, renews it while active; `on_change(active)`
    runs on each change (subscribe to placements, or stop)."""

    def __init__(
        self,
        js: JetStreamContext,
        holder: str,
        lease: Lease,
        on_change: OnChange,
        replicas: int = 1,
    ) -> None:
        self.js = js
        self.replicas = replicas
        self.holder = holder.encode()
        self.lease = lease
        self.on_change = on_change
        self.kv: KeyValue | None = None

    @property
    def bucket_config(self) -> KeyValueConfig:
        return KeyValueConfig(
            bucket=subjects.CONDUCTOR_LEASE, ttl=self.lease.config.ttl, replicas=self.replicas
        )

    async def open(self) -> None:
        self.kv = await open_bucket(self.js, self.bucket_config)

    async def run(self) -> None:
        while True:
            await self.step()
            await asyncio.sleep(self.lease.next_wait())

    async def step(self) -> None:
        """One claim attempt (standby) or renewal (active)."""
        if self.lease.held and not self.lease.active(time.monotonic()):
            await self._lose("no renewal landed within the lease")
            return
        try:
            await (self._renew() if self.lease.held else self._claim())
        except NotFoundError:
            log.warning("%s: the lease bucket is gone (NATS lost it); making it again", self)
            await self.open()
        except NatsError as e:  # timeouts included: the next step tries again
            what = "renewal" if self.lease.held else "claim"
            log.warning("%s: lease %s failed: %s", self, what, e)

    async def release(self) -> None:
        """On a clean stop: delete the key, so that a standby claims at once."""
        if not self.lease.held or self.kv is None:
            return
        try:
            await self.kv.delete(KEY, last=self.lease.revision)
        except NatsError as e:
            log.warning("%s: could not release the lease (it expires): %s", self, e)
        await self._lose("released")

    async def _claim(self) -> None:
        sent = time.monotonic()
        try:
            revision = await self._kv().create(KEY, self.holder)
        except KeyWrongLastSequenceError:
            return  # another conductor is active
        self.lease.claimed(revision, sent)
        log.info("%s: active (lease epoch %d)", self, revision)
        await self.on_change(True)

    async def _renew(self) -> None:
        sent = time.monotonic()
        try:
            revision = await self._kv().update(KEY, self.holder, last=self.lease.revision)
        except KeyWrongLastSequenceError:
            await self._lose("another conductor claimed the lease")
            return
        self.lease.renewed(revision, sent)

    async def _lose(self, why: str) -> None:
        self.lease.lost()
        log.warning("%s: standby now: %s", self, why)
        await self.on_change(False)

    def _kv(self) -> KeyValue:
        if self.kv is None:
            raise RuntimeError("open() the lease bucket first")
        return self.kv

    def __str__(self) -> str:
        return self.holder.decode()
