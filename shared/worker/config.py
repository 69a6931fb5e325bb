"""What prefill and decode workers share: their config and their heartbeat."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shared.engine.config import EngineConfig
from shared.engine.mock import MockSpec
from shared.engine.stats import EngineStats
from shared.errors import KvstackError
from shared.kvpool.mooncake_store import MooncakeStoreConfig
from shared.messages import Heartbeat, WorkerStats
from shared.runtime.service import ServiceConfig
from shared.transfer.common.encryption import require_token
from shared.transfer.factory import refuse_encryption
from shared.worker.core import load_heartbeat

if TYPE_CHECKING:
    from shared.engine.interface import EngineInterface


@dataclass(frozen=True)
class WorkerConfig(ServiceConfig):
    model: str = "SmolLM2-135M-Instruct"
    device: str = "cpu"  # EngineConfig.device; the KV moves through a host mirror on a GPU
    dtype: str = "auto"
    weights: str = "auto"  # EngineConfig.weights
    activations: str = "q16"  # EngineConfig.activations
    prefill_weights: str = "auto"  # EngineConfig.prefill_weights (a decode worker: engine_config)
    block_size: int = 16
    kv_cache_bytes: int = 1 << 30
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 64
    long_prefill_tokens: int | None = None  # a prompt's chunk while others prefill (None:
    # the scheduler's default, 0: no limit)
    num_threads: int | None = None
    enable_prefix_cache: bool = True
    fused_decode: bool = True  # EngineConfig.fused_decode
    decode_burst: int = 1  # EngineConfig.decode_burst (the CLI's default: DECODE_BURST)
    data_host: str = "127.0.0.1"  # where this worker receives KV bytes
    data_port: int = 0
    advertise_data_addr: str = ""  # what peers should dial, if not the bound address
    data_token: str = ""  # shared secret of the data plane (KVSTACK_DATA_TOKEN)
    data_encrypt: bool = False  # encrypt KV bytes on the tcp data plane (needs data_token)
    shared_memory: bool = True  # a ring in /dev/shm to a peer on this host (tcp.ring)
    transport: str = "tcp"  # prefill -> decode KV stream: "tcp" or "mooncake"
    request_timeout: float = 10.0  # one control round trip (reserve, commit)
    take_pool_prefix: bool = True  # decode: a prompt's prefix the KV pool holds, got there
    attention_workers: tuple[str, ...] = ()  # decode: offload attention to this group
    micro_batches: int = 2  # decode, offloaded: staggered micro-batches per step
    attention_recovery_timeout: float = 30.0  # decode: wait this long for a group to re-form
    mock: MockSpec | None = None  # the mock engine: no model (model names the tokenizer)
    max_model_len: int | None = None  # default: the model's own limit
    mooncake: MooncakeStoreConfig | None = None  # the KV pool: Mooncake Store; None: kvstore

    def __post_init__(self) -> None:
        if self.mock is not None and self.attention_workers:
            raise KvstackError(
                "attention offload (--attention-workers) does not run with the "
                "mock engine; use --engine torch"
            )
        self._check_encryption()

    def _check_encryption(self) -> None:
        """Under --data-encrypt every KV byte must travel over the tcp transport, the one
        that encrypts, keyed by the data token."""
        require_token(self.data_token, self.data_encrypt)
        in_clear = {
            "--transport mooncake": self.transport != "tcp",
            "--kv-pool mooncake": self.mooncake is not None,
            "attention offload (--attention-workers)": bool(self.attention_workers),
        }
        for what in (what for what, used in in_clear.items() if used):
            refuse_encryption(self.data_encrypt, what)

    def engine_config(self, prefills: bool = True) -> EngineConfig:
        """The engine's config; `prefills` False (a decode worker: it prefills only to
        recompute) keeps no bfloat16 copy for prefill unless --prefill-weights asks for one."""
        copy = self.prefill_weights != "auto" or prefills
        return EngineConfig(
            model=self.model,
            device=self.device,
            dtype=self.dtype,
            weights=self.weights,
            activations=self.activations,
            prefill_weights=self.prefill_weights if copy else "quantized",
            block_size=self.block_size,
            kv_cache_bytes=self.kv_cache_bytes,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs,
            long_prefill_tokens=self.long_prefill_tokens,
            num_threads=self.num_threads,
            detokenize=False,
            enable_prefix_cache=self.enable_prefix_cache,
            fused_decode=self.fused_decode,
            decode_burst=self.decode_burst,
            mock=self.mock,
            max_model_len=self.max_model_len,
        )


def worker_heartbeat(
    service: str,
    worker_id: str,
    config: WorkerConfig,
    engine: EngineInterface,
    http_addr: str,
    data_addr: str,
    draining: bool,
    load: EngineStats | None = None,
) -> Heartbeat:
    """Load as the engine sees it (read without locks: a slightly stale view is fine), or
    `load` where the worker counts more than its engine does."""
    return load_heartbeat(
        service,
        worker_id,
        time.time(),
        config.heartbeat_interval,
        config.block_size,
        engine.stats() if load is None else load,
        http_addr=http_addr,
        data_addr=data_addr,
        model=config.model,
        draining=draining,
        caches_prefixes=config.enable_prefix_cache,
    )


def prompt_problem(engine: EngineInterface, prompt_token_ids: Sequence[int]) -> str:
    """What is wrong with a prompt for this engine, or "" when nothing."""
    try:
        engine.validate_prompt(prompt_token_ids)
    except KvstackError as e:
        return str(e)
    return ""


def worker_stats(
    worker_id: str,
    engine: EngineInterface,
    num_reserved: int,
    num_done: int,
    num_refused: int = 0,
) -> WorkerStats:
    stats = engine.stats()
    return WorkerStats(
        worker_id,
        stats.num_running,
        stats.num_waiting,
        stats.free_blocks,
        stats.total_blocks,
        num_reserved,
        num_done,
        num_refused,
    )
