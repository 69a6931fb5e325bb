"""What one simulation runs: the cluster's shape, its caches and KV pools, how often
workers report, and the conductor's scheduling config."""

from __future__ import annotations

from dataclasses import dataclass, field

from loadgen.trace import TRACE_BLOCK_SIZE
from shared.conductor.config import SchedulingConfig
from shared.engine.mock import MockSpec
from shared.errors import KvstackError

# As live: a worker beats every second (shared/runtime/service.py: ServiceConfig) and a prefill
# worker publishes its cache's KV events every 0.2 s (services/prefill/sharing.py); the
# tests check that these still match.
HEARTBEAT_INTERVAL = 1.0
EVENT_INTERVAL = 0.2
# Mooncake FAST §5.3.1: ~1 TB of DRAM per node holds ~3M tokens of LLaMA3-70B KV.
DEFAULT_CACHE_TOKENS = 3_000_000
# Colocated nodes have no pool to load a remote prefix from: the policies that need none.
COLOCATED_POLICIES = ("random", "round-robin", "load-balance", "cache-aware")


@dataclass(frozen=True)
class SimConfig:
    kv_tokens: int  # KV tokens a decode (or colocated) node holds
    num_prefill: int = 0
    num_decode: int = 0
    num_colocated: int = 0
    scheduling: SchedulingConfig = field(default_factory=SchedulingConfig)
    cache_tokens: int = DEFAULT_CACHE_TOKENS  # each node's DRAM prefix cache
    pool: bool = True  # the caches form the global pool (disaggregated)
    heartbeat_interval: float = HEARTBEAT_INTERVAL
    event_interval: float = EVENT_INTERVAL
    sample_interval: float = 1.0  # the load time series
    seed: int = 0  # names requests: the `random` policy seeds by name
    # False: a prefill reuses only its own node's cache, whatever the placement names (no
    # pool, no peer): the local-cache-only baselines of Mooncake's scheduling experiment
    remote_prefix: bool = True

    def __post_init__(self) -> None:
        disaggregated = self.num_prefill or self.num_decode
        if bool(disaggregated) == bool(self.num_colocated):
            raise KvstackError(
                "give either --prefill N and --decode M (disaggregated) or --colocated K, not both"
            )
        if disaggregated and min(self.num_prefill, self.num_decode) <= 0:
            raise KvstackError(
                f"a disaggregated cluster needs at least one prefill and one "
                f"decode node, got {self.num_prefill} and {self.num_decode}"
            )
        if self.num_colocated < 0 or self.cache_tokens < 0 or self.kv_tokens <= 0:
            raise KvstackError(
                "node counts and --cache-tokens must not be negative and the "
                "KV capacity must be positive"
            )
        for name in ("heartbeat_interval", "event_interval", "sample_interval"):
            if getattr(self, name) <= 0:
                raise KvstackError(f"{name} must be positive, got {getattr(self, name)}")
        if self.colocated:
            self._check_colocated()

    def _check_colocated(self) -> None:
        policy, admission = self.scheduling.policy, self.scheduling.admission
        if policy not in COLOCATED_POLICIES:
            raise KvstackError(
                f"colocated nodes have no KV pool to load from, so policy "
                f"{policy!r} does not apply; choose from "
                f"{', '.join(COLOCATED_POLICIES)}"
            )
        if admission != "none":
            raise KvstackError(
                f"colocated nodes run without admission (vLLM-like); got --admission {admission}"
            )

    @property
    def colocated(self) -> bool:
        return self.num_colocated > 0

    @property
    def cache_blocks(self) -> int:
        return self.cache_tokens // TRACE_BLOCK_SIZE


def node_kv_tokens(model: str, hardware: str) -> int:
    """KV tokens one node of `hardware` holds beside `model`'s weights (its HBM at the
    memory share an engine fills), as the mock engine sizes its pool."""
    blocks = MockSpec(model, hardware, kv_scale=1.0).real_capacity_blocks(TRACE_BLOCK_SIZE)
    if blocks is None:
        raise KvstackError(f"the HBM size of {hardware!r} is not known: give --kv-tokens")
    return blocks * TRACE_BLOCK_SIZE
