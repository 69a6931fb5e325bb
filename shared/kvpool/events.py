"""KV events as messages: chunked so that a large snapshot or a busy interval stays under
NATS' payload limit (1 MiB by default; a block hash is up to 20 bytes of JSON)."""

from __future__ import annotations

from collections.abc import Sequence

from shared import subjects
from shared.messages import KVEvent
from shared.runtime.bus import Bus

HASHES_PER_EVENT = 20_000


def kv_events(
    source: str,
    service: str,
    stored: Sequence[int],
    removed: Sequence[int] = (),
    snapshot: bool = False,
) -> list[KVEvent]:
    """The events to publish, in order; with `snapshot`, the first one says that `stored`
    is all that `source` holds (the rest only add to it)."""
    stored_parts = _chunks(stored) or [()]
    events = [
        KVEvent(source, service, part, (), snapshot and i == 0)
        for i, part in enumerate(stored_parts)
        if part or (snapshot and i == 0)
    ]
    events += [KVEvent(source, service, (), part) for part in _chunks(removed)]
    return events


async def publish_kv_events(
    bus: Bus,
    source: str,
    service: str,
    stored: Sequence[int],
    removed: Sequence[int] = (),
    snapshot: bool = False,
) -> None:
    """Publish what `kv_events` makes of these changes, in order."""
    for event in kv_events(source, service, stored, removed, snapshot):
        await bus.publish(subjects.kv_events(source), event)


def _chunks(hashes: Sequence[int]) -> list[tuple[int, ...]]:
    return [
        tuple(hashes[i : i + HASHES_PER_EVENT]) for i in range(0, len(hashes), HASHES_PER_EVENT)
    ]
