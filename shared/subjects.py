"""Every NATS subject kvstack uses, in one place.

Control messages only: KV bytes never travel over NATS (see shared/transfer).
A subject that carries a worker's word about itself (heartbeats, KV events) ends with the
worker's id: NATS permissions let only that worker publish there (shared/auth/roles.py),
and `sender_of` lets a subscriber check that the message speaks for the same id.
"""

from __future__ import annotations

import re

PREFIX = "kvstack"
# A worker id is one subject token: no dots, spaces or wildcards.
WORKER_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


def heartbeat(service: str, worker_id: str) -> str:
    return f"{PREFIX}.heartbeat.{service}.{worker_id}"


def sender_of(subject: str) -> str:
    """The worker id a heartbeat or KV event subject names (its last token)."""
    return subject.rsplit(".", 1)[-1]


def all_heartbeats() -> str:
    return f"{PREFIX}.heartbeat.>"


def place() -> str:
    """Conductor: where should this request run (request/reply)."""
    return f"{PREFIX}.conductor.place"


def prefill_submit(worker_id: str) -> str:
    return f"{PREFIX}.prefill.{worker_id}.submit"


def decode_reserve(worker_id: str) -> str:
    """Decode: hold blocks for a request whose KV is about to arrive (request/reply)."""
    return f"{PREFIX}.decode.{worker_id}.reserve"


def decode_commit(worker_id: str) -> str:
    """Decode: the KV of a request is sent, here is its first token (request/reply)."""
    return f"{PREFIX}.decode.{worker_id}.commit"


def worker_stats(service: str, worker_id: str) -> str:
    return f"{PREFIX}.{service}.{worker_id}.stats"


def tokens(request_id: str) -> str:
    """Tokens of one request, from its workers to the gateway that holds the client."""
    return f"{PREFIX}.tokens.{request_id}"


def abort() -> str:
    """Broadcast: stop a request wherever it is (client gone, deadline passed)."""
    return f"{PREFIX}.abort"


def kvstore_op(worker_id: str, op: str) -> str:
    """A kvstore instance's lookup / get / put endpoints (request/reply)."""
    return f"{PREFIX}.kvstore.{worker_id}.{op}"


def prefill_get(worker_id: str) -> str:
    """A prefill worker serves blocks of its local cache to peers (hot-spot replication)."""
    return f"{PREFIX}.prefill.{worker_id}.get"


def kv_events(source: str) -> str:
    """Blocks stored in or removed from one cache (prefill, decode or kvstore)."""
    return f"{PREFIX}.kv_events.{source}"


def all_kv_events() -> str:
    return f"{PREFIX}.kv_events.*"


def kv_resync() -> str:
    """Broadcast: a conductor wants a snapshot KVEvent from every cache."""
    return f"{PREFIX}.kv_resync"


def request_done() -> str:
    """Broadcast: a request finished (from the gateway), for predictions of output length."""
    return f"{PREFIX}.request_done"


def conductor_stats() -> str:
    return f"{PREFIX}.conductor.stats"


def attention_op(worker_id: str, op: str) -> str:
    """An attention worker's attach / expect / settle endpoints (request/reply)."""
    return f"{PREFIX}.attention.{worker_id}.{op}"


# JetStream key-value buckets (conductor failover, docs/conductor.md). A bucket is a stream
# named KV_<bucket>; its keys are the subjects $KV.<bucket>.<key>.
CONDUCTOR_LEASE = "kvstack-conductor-lease"  # one key: which conductor is active
PLACEMENTS = "kvstack-placements"  # one key per placed request id: placed once


def key_value_access(bucket: str) -> tuple[str, ...]:
    """What a client publishes to create, read and write one JetStream key-value bucket."""
    stream = f"KV_{bucket}"
    return (
        f"$JS.API.STREAM.CREATE.{stream}",
        f"$JS.API.STREAM.INFO.{stream}",
        f"$JS.API.STREAM.MSG.GET.{stream}",
        f"$JS.API.DIRECT.GET.{stream}.>",
        f"$KV.{bucket}.>",
    )
