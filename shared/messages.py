"""Every control message kvstack sends over NATS.

Each carries the request id where it concerns a request, and a deadline (unix
seconds) where waiting matters. Encoded with `shared.codec` (orjson).
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.codec import message
from shared.kvblocks import BlockLayout
from shared.logprob import TokenLogprob
from shared.sampling_params import SamplingParams


@message("heartbeat")
@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A service's liveness and load, published every `interval` seconds."""

    service: str
    worker_id: str
    time: float
    interval: float
    http_addr: str = ""
    data_addr: str = ""  # where peers send KV bytes (host:port)
    model: str = ""
    block_size: int = 0
    num_running: int = 0
    num_waiting: int = 0
    queued_tokens: int = 0  # prompt tokens admitted but not yet computed
    context_tokens: int = 0  # KV tokens of the running requests (decode's step cost)
    free_blocks: int = 0
    total_blocks: int = 0
    draining: bool = False  # finishing what it holds: place nothing new here
    instance: str = ""  # one process's life: a restart under the same id changes it
    stopped: bool = False  # the last beat of a clean stop: forget this worker now
    reconnections: int = 0  # of its NATS connection: what it sent just before may be lost
    caches_prefixes: bool = True  # a prefill worker keeps computed blocks for later prompts


@message("placement_request")
@dataclass(frozen=True, slots=True)
class PlacementRequest:
    request_id: str
    num_prompt_tokens: int
    max_tokens: int
    deadline: float
    block_hashes: tuple[int, ...] = ()
    exclude: tuple[str, ...] = ()  # workers that already failed this request
    slo_ttft: float = 0.0  # seconds; 0: the conductor's default
    slo_tbt: float = 0.0


@message("placement")
@dataclass(frozen=True, slots=True)
class Placement:
    request_id: str
    accepted: bool
    prefill_id: str = ""
    decode_id: str = ""
    reason: str = ""
    retry_after: float = 0.0
    prefix_peer: str = ""  # a prefill worker holding more of the prefix than the pool
    prefix_peer_blocks: int = 0
    load_prefix: bool = True  # False: recompute what is not cached locally (cheaper)
    stage_tbt_slo: float = 0.0  # > 0: decode re-checks its own TBT on arrival (baseline)
    predicted_ttft: float = 0.0
    predicted_tbt: float = 0.0
    # what predicted_ttft is made of: waiting (the request's way to the worker included),
    # loading the prefix, computing the rest (seconds)
    predicted_queue: float = 0.0
    predicted_transfer: float = 0.0
    predicted_prefill: float = 0.0
    # of predicted_queue, the stack's own path time (learned: shared/conductor/overhead.py)
    predicted_overhead: float = 0.0
    # the lease epoch of the conductor that placed it (0: no lease), which grows with each
    # new active conductor: a fencing token (docs/conductor.md, "Failover")
    epoch: int = 0


@message("prefill_request")
@dataclass(frozen=True, slots=True)
class PrefillRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    decode_id: str
    deadline: float
    prefix_peer: str = ""
    prefix_peer_blocks: int = 0
    load_prefix: bool = True
    stage_tbt_slo: float = 0.0


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
    namespace: str  # model and dtype; KV of another layout is refused
    deadline: float
    prefill_id: str = ""
    stage_tbt_slo: float = 0.0  # > 0: refuse at commit if this worker's TBT is over it


@dataclass(frozen=True, slots=True)
class KVShard:
    """Where KV heads [kv_head_start, kv_head_end) of a request go (an attention worker)."""

    data_addr: str
    kv_head_start: int
    kv_head_end: int


@message("kv_reservation")
@dataclass(frozen=True, slots=True)
class KVReservation:
    """Blocks held for a request's KV. With `shards` (a decode worker that offloads
    attention) the KV goes, split by KV heads, to each shard's address instead of
    `data_addr`, into the same `block_ids` on every shard. The first `num_held` blocks
    the decode worker already holds (its prefix cache): their KV is not sent."""

    request_id: str
    ok: bool
    block_ids: tuple[int, ...] = ()
    data_addr: str = ""
    reason: str = ""
    code: int = 200
    shards: tuple[KVShard, ...] = ()
    num_held: int = 0


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
    prefill_timing: PrefillTiming | None = None  # on the prefill worker's event (seq 0)
    decode_wait: float = 0.0  # seq 1: seconds from adoption to this first decoded token


@dataclass(frozen=True, slots=True)
class PrefillTiming:
    """Where a request's time went on its prefill worker before its first token, in
    seconds of that worker's clock, and where its cached prompt tokens came from."""

    reserve: float = 0.0  # the decode worker reserving blocks for its KV
    prefix: float = 0.0  # binding its prefix (reserving blocks, starting the fetch)
    queue: float = 0.0  # in the worker's queue and the engine's before its first step
    compute: float = 0.0  # its first step to its first token (prefix loads overlap it)
    transfer: float = 0.0  # ending the KV stream until the decode worker adopted it
    cached_local: int = 0  # prompt tokens found in the worker's own cache
    cached_kvstore: int = 0  # fetched from the kvstore pool
    cached_peer: int = 0  # fetched from another prefill worker
    prefix_bytes: int = 0  # KV bytes of the fetched prefix (pool or peer)
    prefix_load: float = 0.0  # its fetch's start until its last frame landed intact
    handoff_bytes: int = 0  # KV bytes sent to the decode side (streamed during compute)
    held_decode: int = 0  # prompt tokens whose KV the decode worker held: not sent

    @property
    def total(self) -> float:
        return self.reserve + self.prefix + self.queue + self.compute + self.transfer


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
    num_reserved: int = 0  # requests holding blocks whose KV is in flight
    num_requests_done: int = 0
    num_transfers_refused: int = 0  # KV that arrived damaged or incomplete, never used
    blocks_from_kvstore: int = 0  # prefix blocks loaded from the kvstore pool (decode: its own
    # gets at reservation, services/decode/pool_prefix.py)
    blocks_from_peers: int = 0  # prefix blocks loaded from peer prefill workers
    blocks_served: int = 0  # blocks of this worker's cache sent to peers
    num_rejected_after_prefill: int = 0  # decode refused at commit (wasted prefill)


@message("block_lookup")
@dataclass(frozen=True, slots=True)
class BlockLookup:
    block_hashes: tuple[int, ...]


@message("block_presence")
@dataclass(frozen=True, slots=True)
class BlockPresence:
    present: tuple[bool, ...]


@message("block_get")
@dataclass(frozen=True, slots=True)
class BlockGet:
    """Send these blocks, layer by layer, into my blocks `dest_block_ids` at `dest_addr`.

    All or nothing: if any block is missing the reply says so and nothing is sent.
    `request_id` names the transfer on the data plane.
    """

    request_id: str
    block_hashes: tuple[int, ...]
    dest_block_ids: tuple[int, ...]
    layout: BlockLayout
    dest_addr: str
    deadline: float


@message("block_put")
@dataclass(frozen=True, slots=True)
class BlockPut:
    """I will send these blocks: give me a slot for each one you do not have yet."""

    request_id: str
    block_hashes: tuple[int, ...]
    layout: BlockLayout
    deadline: float


@message("put_slots")
@dataclass(frozen=True, slots=True)
class PutSlots:
    request_id: str
    ok: bool
    slots: tuple[int, ...] = ()  # one per block: where to send it, or -1: skip it
    data_addr: str = ""
    reason: str = ""


@message("kv_event")
@dataclass(frozen=True, slots=True)
class KVEvent:
    """Blocks that became available in, or left, one worker's cache."""

    source: str  # worker id
    service: str  # "prefill", "decode" or "kvstore"
    stored: tuple[int, ...] = ()
    removed: tuple[int, ...] = ()
    snapshot: bool = False  # `stored` is everything the source holds (a resync answer)


@message("kv_resync")
@dataclass(frozen=True, slots=True)
class KVResync:
    """A conductor that (re)started asks every cache to publish a snapshot KVEvent."""

    requester: str


@message("request_done")
@dataclass(frozen=True, slots=True)
class RequestDone:
    """What a finished request turned out to need (the gateway reports; predictions learn)."""

    request_id: str
    first_block_hash: int
    num_prompt_tokens: int
    num_output_tokens: int
    ttft: float
    tbt: float  # mean seconds between tokens after the first
    predicted_ttft: float = 0.0  # the placement's (0: not known)
    predicted_tbt: float = 0.0
    predicted_queue: float = 0.0
    predicted_prefill: float = 0.0
    predicted_overhead: float = 0.0  # of predicted_queue (and predicted_ttft)
    # parts of the TTFT as measured (-1: not measured): the wait before the prefill's first
    # step, and that prefill's compute (measured only when no prefix was loaded into it)
    queue: float = -1.0
    prefill: float = -1.0


@dataclass(frozen=True, slots=True)
class EstimateError:
    """How far one of the conductor's estimates fell from what happened, over requests."""

    estimate: str  # queue, transfer, prefill, ttft or tbt
    count: int
    median_abs_rel_error: float  # |predicted - actual| / actual, the median over requests
    p90_abs_rel_error: float
    mean_rel_error: float  # signed: > 0 when predictions run long on average
    median_abs_error_s: float


@message("conductor_stats")
@dataclass(frozen=True, slots=True)
class ConductorStats:
    worker_id: str
    policy: str
    admission: str
    num_indexed_blocks: int
    num_accepted: int
    num_rejected: int
    num_replications: int  # placements that pull a remote prefix into the chosen worker
    live_prefill: tuple[str, ...] = ()
    live_decode: tuple[str, ...] = ()
    estimates: tuple[EstimateError, ...] = ()  # over the latest finished requests
    num_pooled_blocks: int = 0  # of the indexed blocks, those a kvstore holds


@message("store_stats")
@dataclass(frozen=True, slots=True)
class StoreStats:
    worker_id: str
    dram_blocks: int
    disk_blocks: int
    dram_bytes: int
    disk_bytes: int
    hits: int
    misses: int


@message("attention_attach")
@dataclass(frozen=True, slots=True)
class AttentionAttach:
    """A decode worker makes an attention worker shard `shard` of its group of
    `group_size`: it then holds KV heads [shard, shard + 1) * num_kv_heads / group_size
    of every offloaded request (its pool is rebuilt: earlier KV is dropped)."""

    decode_id: str
    group_size: int
    shard: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: str


@message("attention_attached")
@dataclass(frozen=True, slots=True)
class AttentionAttached:
    ok: bool
    num_blocks: int = 0
    link_addr: str = ""  # the attention link (q, k, v out; attention output back)
    data_addr: str = ""  # where prefill workers send KV of this shard's heads
    error: str = ""
    instance: str = ""  # the attached process (a restart under the id drops the KV)


@message("kv_expect")
@dataclass(frozen=True, slots=True)
class KVExpect:
    """Hold `block_ids` for a request's KV that a prefill worker is about to send."""

    request_id: str
    block_ids: tuple[int, ...]
    num_layers: int
    ttl: float


@message("kv_settle")
@dataclass(frozen=True, slots=True)
class KVSettle:
    """ok: check that all `num_frames` frames landed intact and keep the KV; not ok: drop
    the expectation (and whatever landed)."""

    request_id: str
    ok: bool
    num_frames: int = 0


@message("attention_stats")
@dataclass(frozen=True, slots=True)
class AttentionStats:
    worker_id: str
    decode_id: str
    num_requests: int  # requests whose KV this worker holds
    used_blocks: int
    total_blocks: int
    kv_heads: tuple[int, int] = (0, 0)
    num_attention_calls: int = 0  # (micro-batch, layer) computations served
    link_bytes_in: int = 0
    link_bytes_out: int = 0
    kv_bytes_received: int = 0
