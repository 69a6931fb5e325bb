"""Placed once: every accepted placement is written to a JetStream key-value bucket under
its request id with `create`, which only one writer can win. A request asked again (its
reply was lost with a conductor that died) gets the placement on record, whichever
conductor made it; so no request id is ever placed on two sets of workers."""

from __future__ import annotations

import hashlib
import re

from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig
from nats.js.errors import KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from services.conductor.lease import open_bucket
from shared import codec, subjects
from shared.messages import Placement

# NOTE: long enough for a request to get its first token (the gateway's deadline), after
# which nobody asks for its placement again
RECORD_SECONDS = 600.0
RECORD_BYTES = 64 << 20  # past it the oldest records go first
KEY = re.compile(r"[-_=A-Za-z0-9]{1,128}")


class PlacementRecords:
    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv

    @classmethod
    async def open(cls, js: JetStreamContext, replicas: int = 1) -> PlacementRecords:
        config = KeyValueConfig(
            bucket=subjects.PLACEMENTS,
            ttl=RECORD_SECONDS,
            max_bytes=RECORD_BYTES,
            replicas=replicas,
        )
        return cls(await open_bucket(js, config))

    async def record(self, placement: Placement) -> Placement:
        """`placement`, or the one already on record for its request id."""
        key = record_key(placement.request_id)
        try:
            await self.kv.create(key, codec.encode(placement))
            return placement
        except KeyWrongLastSequenceError:
            entry = await self.kv.get(key)
        return codec.decode(entry.value or b"", Placement)


def record_key(request_id: str) -> str:
    """The request id where it is a valid key, else a digest of it."""
    if KEY.fullmatch(request_id):
        return request_id
    return "sha256-" + hashlib.sha256(request_id.encode()).hexdigest()
