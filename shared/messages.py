"""Every control message kvstack sends over NATS.

Each carries the request id where it concerns a request, and a deadline (unix
seconds) where waiting matters. Encoded with `shared.codec` (orjson).
"""
from __future__ import annotations

from dataclasses import dataclass

from shared.codec import message
from shared.engine.sampler import TokenLogprob
from shared.engine.sampling_params import SamplingParams


@message("heartbeat")
@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A service's liveness and load, published every `interval` seconds."""
    service: str
    worker_id: str
    time: float
    interval: float
    http_addr: str = ""
    data_addr: str = ""           # where peers send KV bytes (host:port)
    model: str = ""
    block_size: int = 0
    num_running: int = 0
    num_waiting: int = 0
    queued_tokens: int = 0        # prompt tokens admitted but not yet computed
    free_blocks: int = 0
    total_blocks: int = 0
    draining: bool = False


@message("placement_request")
@dataclass(frozen=True, slots=True)
class PlacementRequest:
    request_id: str
    num_prompt_tokens: int
    max_tokens: int
    deadline: float
    block_hashes: tuple[int, ...] = ()
    exclude: tuple[str, ...] = ()   # workers that already failed this request


@message("placement")
@dataclass(frozen=True, slots=True)
class Placement:
    request_id: str
    accepted: bool
    prefill_id: str = ""
    decode_id: str = ""
    reason: str = ""
    retry_after: float = 0.0


@message("prefill_request")
@dataclass(frozen=True, slots=True)
class PrefillRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    decode_id: str
    deadline: float


@message("ack")
@dataclass(frozen=True, slots=True)
class Ack:
    """Reply to a request that only needs yes or no; `code` is an HTTP-like status."""
    request_id: str
    ok: bool
    error: str = ""
    code: int = 200


@message("kv_reserve")
@dataclass(frozen=True, slots=True)
class KVReserve:
    """Prefill asks a decode worker to hold blocks for a request's KV before sending it."""
    request_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    block_size: int
    namespace: str                # model and dtype; KV of another layout is refused
    deadline: float
    prefill_id: str = ""


@message("kv_reservation")
@dataclass(frozen=True, slots=True)
class KVReservation:
    request_id: str
    ok: bool
    block_ids: tuple[int, ...] = ()
    data_addr: str = ""
    reason: str = ""
    code: int = 200


@message("kv_commit")
@dataclass(frozen=True, slots=True)
class KVCommit:
    """The prefill side is done: all frames sent (or failed), and the first token."""
    request_id: str
    ok: bool
    num_frames: int = 0
    first_token: int = -1
    first_logprob: TokenLogprob | None = None
    num_cached_tokens: int = 0
    reason: str = ""


@message("token_event")
@dataclass(frozen=True, slots=True)
class TokenEvent:
    """New tokens of one request; `seq` orders events from different workers."""
    request_id: str
    seq: int
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[TokenLogprob, ...] | None = None
    finished: bool = False
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    error: str = ""
    code: int = 200


@message("abort")
@dataclass(frozen=True, slots=True)
class Abort:
    request_id: str
    reason: str = ""


@message("stats_request")
@dataclass(frozen=True, slots=True)
class StatsRequest:
    pass


@message("worker_stats")
@dataclass(frozen=True, slots=True)
class WorkerStats:
    worker_id: str
    num_running: int
    num_waiting: int
    free_blocks: int
    total_blocks: int
    num_reserved: int = 0         # requests holding blocks whose KV is in flight
    num_requests_done: int = 0
    num_transfers_refused: int = 0   # KV that arrived damaged or incomplete, never used
