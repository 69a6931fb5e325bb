"""Every command-line setting of `kvstack up` and of the service commands, once (see
`setting.py`), and which command takes which. A setting is named by its key in SETTINGS;
a command may give it another default or help (`COMMAND_CHANGES`)."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

from services.gateway.backend import BackendTimeouts
from shared import setting
from shared.conductor.settings import SCHEDULING_SETTINGS
from shared.costmodel import HARDWARE, MODELS
from shared.engine.config import (
    ACTIVATIONS_CHOICES,
    ATTENTION_CHOICES,
    DECODE_BURST,
    DTYPE_CHOICES,
    PREFILL_WEIGHTS_CHOICES,
    WEIGHTS_CHOICES,
)
from shared.engine.mock import ENGINES, MOCK_MAX_MODEL_LEN, MockSpec
from shared.kvpool.pool import KV_POOLS
from shared.model.registry import DEFAULT_MODEL
from shared.setting import Setting
from shared.transfer.factory import TRANSPORTS

_timeouts = BackendTimeouts()
_LONG_PREFILL_HELP = (
    "most prompt tokens one request computes per step while others prefill too, so a long "
    "prompt cannot starve short ones (default: max(block size, max-num-batched-tokens / 4); "
    "0: no limit)"
)

SETTINGS: dict[str, Setting] = {
    # Every service: the bus, identity, HTTP endpoint, lifecycle.
    "nats": Setting(
        "--nats",
        "NATS server URL, or several comma-separated: every node of a cluster (env KVSTACK_NATS)",
        default="nats://127.0.0.1:4222",
        env="KVSTACK_NATS",
    ),
    "worker_id": Setting("--worker-id", "default: <service>-<host>-<pid>", default=""),
    "host": Setting("--host", "HTTP bind address", default="127.0.0.1"),
    "http_port": Setting("--http-port", "0: any free port", type=int, default=0),
    "heartbeat_interval": Setting("--heartbeat-interval", type=float, default=1.0),
    "drain_timeout": Setting(
        "--drain-timeout",
        "seconds each service may take to finish its work when stopping",
        type=float,
        default=30.0,
    ),
    "otlp_endpoint": Setting(
        "--otlp-endpoint",
        "send traces (OpenTelemetry, one per request) to the OTLP/HTTP collector at this "
        "base URL, e.g. http://localhost:4318 (env OTEL_EXPORTER_OTLP_ENDPOINT; default: "
        "off; needs the `tracing` extra)",
        default="",
        env="OTEL_EXPORTER_OTLP_ENDPOINT",
    ),
    # Credentials of the control bus and the data plane (docs/security.md).
    "nats_creds": Setting(
        "--nats-creds",
        "this service's NATS credentials file (env KVSTACK_NATS_CREDS; made by "
        "`kvstack up` or `kvstack auth init`)",
        default="",
        env="KVSTACK_NATS_CREDS",
    ),
    "nats_tls_ca": Setting(
        "--nats-tls-ca",
        "verify the NATS server's TLS certificate against this CA (PEM; env KVSTACK_NATS_TLS_CA)",
        default="",
        env="KVSTACK_NATS_TLS_CA",
    ),
    "data_token_file": Setting(
        "--data-token-file",
        "the data plane's shared secret, from a file (env KVSTACK_DATA_TOKEN_FILE; or the "
        "secret itself in KVSTACK_DATA_TOKEN)",
        default="",
        env="KVSTACK_DATA_TOKEN_FILE",
    ),
    "insecure": Setting(
        "--insecure",
        "run without credentials: on a NATS server that lets anyone in, with an "
        "unauthenticated data plane (env KVSTACK_INSECURE=1)",
        default=False,
        env="KVSTACK_INSECURE",
        switch=True,
    ),
    # The model and its KV cache, on workers (the gateway names KV blocks with them too).
    "model": Setting("--model", default=DEFAULT_MODEL),
    "dtype": Setting("--dtype", choices=DTYPE_CHOICES, default="auto"),
    "weights": Setting(
        "--weights",
        "how linear weights are held: auto keeps a GGUF file's quantized blocks (on CPU), "
        "float dequantizes them to --dtype, q8_0/q4_0/q4_1 re-quantize at load",
        choices=WEIGHTS_CHOICES,
        default="auto",
    ),
    "device": Setting(
        "--device",
        "auto (CUDA where torch sees it, else CPU), cpu, cuda or cuda:N",
        default="auto",
    ),
    "attention": Setting(
        "--attention",
        "attention kernels: auto (Triton on a GPU, the native CPU kernels elsewhere), "
        "torch or triton",
        choices=ATTENTION_CHOICES,
        default="auto",
    ),
    "activations": Setting(
        "--activations",
        "how quantized weights take activations: q16 rounds them to 16 bits per block of 32 "
        "and a decode step multiplies in integers (finer than bfloat16; float32's perplexity "
        "to 3 decimals, faster than float where the core, not memory, bounds decode), q8 to "
        "8 bits (as llama.cpp: faster still, about 96 in 100 greedy tokens as float32's), "
        "float keeps them float32 (float32's greedy tokens exactly)",
        choices=ACTIVATIONS_CHOICES,
        default="q16",
    ),
    "prefill_weights": Setting(
        "--prefill-weights",
        "what prompts' matmuls read from quantized weights: quantized dequantizes them on "
        "every pass; bfloat16 or float32 keeps a copy made at load where prompts multiply "
        "in that dtype (bfloat16 on a CPU with native bfloat16 under --dtype auto, else "
        "float32; 2 or 4 bytes a weight more, a faster prefill: docs/benchmarks.md; decode "
        "still reads the quantized ones); auto keeps one in whatever prompts multiply in "
        "where it takes at most an eighth of the memory (the container's, if limited); "
        "decode workers only when asked by name",
        choices=PREFILL_WEIGHTS_CHOICES,
        default="auto",
    ),
    "block_size": Setting("--block-size", type=int, default=16),
    "kv_cache_gib": Setting("--kv-cache-gib", "KV cache size in GiB", type=float, default=1.0),
    "max_num_batched_tokens": Setting("--max-num-batched-tokens", type=int, default=2048),
    "max_num_seqs": Setting("--max-num-seqs", type=int, default=64),
    "long_prefill_tokens": Setting("--long-prefill-tokens", _LONG_PREFILL_HELP, type=int),
    "threads": Setting(
        "--threads",
        "torch threads (default: one per core of --cores, or of the cores this process may use)",
        type=int,
    ),
    "decode_threads": Setting(
        "--decode-threads",
        "torch threads for steps that only decode (default: --threads): fewer leaves cores "
        "to the front end that streams the tokens",
        type=int,
    ),
    "cores": Setting(
        "--cores",
        "pin this process to these CPU cores, e.g. 0-3,8 (default: not pinned, on the cores "
        "it may use)",
        default="",
    ),
    "no_prefix_cache": Setting(
        "--no-prefix-cache",
        "no local prefix cache (reuse only through the kvstore pool)",
        switch=True,
        default=False,
    ),
    "no_fused_decode": Setting(
        "--no-fused-decode",
        "run decode steps layer by layer through the model's modules instead of one native "
        "call per step (the same results; for comparison)",
        switch=True,
        default=False,
    ),
    "decode_burst": Setting(
        "--decode-burst",
        "chain up to this many greedy decode steps in one native call while no request waits "
        "and none asks for logprobs, penalties, biases or a grammar; their tokens stream "
        "together (1: a token a step)",
        type=int,
        default=DECODE_BURST,
    ),
    "gpus": Setting(
        "--gpus",
        "CUDA devices the prefill and decode workers are spread over, round robin, e.g. "
        "0,1 or all (default: none named; each worker takes --device)",
        default="",
    ),
    "no_cuda_graphs": Setting(
        "--no-cuda-graphs",
        "on a GPU, run decode steps eagerly instead of replaying CUDA graphs (the same "
        "results, slower; for comparison and debugging)",
        switch=True,
        default=False,
    ),
    # The data plane.
    "data_host": Setting("--data-host", "data-plane bind address", default="127.0.0.1"),
    "data_port": Setting("--data-port", type=int, default=0),
    "advertise_data_addr": Setting(
        "--advertise-data-addr", "host:port peers should dial", default=""
    ),
    "data_encrypt": Setting(
        "--data-encrypt",
        "encrypt KV bytes on the data plane (AES-256-GCM, keys per connection from the data "
        "token; the tcp transport and the kvstore pool only; every data-plane peer needs the "
        "same setting; env KVSTACK_DATA_ENCRYPT=1; docs/security.md)",
        default=False,
        env="KVSTACK_DATA_ENCRYPT",
        switch=True,
    ),
    "no_shared_memory": Setting(
        "--no-shared-memory",
        "KV bytes to and from peers on this host over the socket too, never through a ring "
        "in /dev/shm (by default used wherever both ends see it: same host, same /dev/shm, "
        "same user; never under --data-encrypt; docs/security.md)",
        switch=True,
        default=False,
    ),
    "transport": Setting(
        "--transport",
        "data plane of the prefill -> decode KV stream",
        choices=TRANSPORTS,
        default="tcp",
    ),
    # The KV pool prefixes are shared through (shared/kvpool/pool.py, docs/kv-pool.md).
    "kv_pool": Setting(
        "--kv-pool",
        "kvstore: kvstack's kvstore instances; mooncake: Mooncake Store (a mooncake_master, "
        "needs the `rdma` extra; env KVSTACK_KV_POOL)",
        choices=KV_POOLS,
        default="kvstore",
        env="KVSTACK_KV_POOL",
    ),
    "mooncake_master": Setting(
        "--mooncake-master",
        "--kv-pool mooncake: the mooncake_master's RPC address host:port (env "
        "KVSTACK_MOONCAKE_MASTER; `kvstack up` starts one)",
        default="",
        env="KVSTACK_MOONCAKE_MASTER",
    ),
    "mooncake_segment_gib": Setting(
        "--mooncake-segment-gib",
        "--kv-pool mooncake: DRAM each worker lends the pool",
        type=float,
        default=1.0,
    ),
    "mooncake_replicas": Setting(
        "--mooncake-replicas",
        "--kv-pool mooncake: copies of each block in the pool",
        type=int,
        default=1,
    ),
    "mooncake_master_args": Setting(
        "--mooncake-master-args",
        "options for the mooncake_master `kvstack up` starts, e.g. its eviction "
        "('-eviction_high_watermark_ratio=0.8 -default_kv_lease_ttl=5s')",
        default="",
    ),
    # The engine; the gateway takes these too (the mock model names the KV blocks).
    "engine": Setting(
        "--engine",
        "torch: run --model; mock: no model, each step takes the cost model's time for "
        "--mock-model on --mock-hardware (--model gives the tokenizer)",
        choices=ENGINES,
        default="torch",
    ),
    "mock_model": Setting(
        "--mock-model",
        f"the model a mock worker stands in for ({', '.join(MODELS)}; default {MockSpec.model})",
    ),
    "mock_hardware": Setting(
        "--mock-hardware",
        f"the instance it runs on ({', '.join(HARDWARE)}; default {MockSpec.hardware})",
    ),
    "mock_kv_scale": Setting(
        "--mock-kv-scale",
        f"KV bytes stored and moved, relative to the real model's (default "
        f"{MockSpec.kv_scale:g}: llama3-70b's 320 KiB per token become 320 B)",
        type=float,
    ),
    "max_model_len": Setting(
        "--max-model-len",
        f"context limit in tokens (0: the model's; mock: {MOCK_MAX_MODEL_LEN})",
        type=int,
        default=0,
    ),
    # A decode worker's own.
    "no_pool_prefix": Setting(
        "--no-pool-prefix",
        "do not take a prompt's prefix from the KV pool at reservation: the prefill worker "
        "sends all of it (for comparison)",
        switch=True,
        default=False,
    ),
    # Attention offload, on a decode worker.
    "attention_workers": Setting(
        "--attention-workers",
        "offload attention to this group of attention-worker ids (comma-separated; the "
        "group size must divide the model's KV heads)",
        default="",
    ),
    "micro_batches": Setting(
        "--micro-batches",
        "staggered micro-batches per step when offloading (1: no overlap)",
        type=int,
        default=2,
    ),
    "attention_recovery_timeout": Setting(
        "--attention-recovery-timeout",
        "seconds to wait for attention workers to re-form a lost group",
        type=float,
        default=30.0,
    ),
    # An attention worker's links.
    "link_port": Setting("--link-port", "the decode worker's link", type=int, default=0),
    "advertise_host": Setting("--advertise-host", "host peers should dial", default=""),
    # A kvstore instance's tiers.
    "dram_gib": Setting("--dram-gib", "DRAM tier size", type=float, default=4.0),
    "disk_dir": Setting("--disk-dir", "SSD tier directory (empty: none)", default=""),
    "disk_gib": Setting("--disk-gib", "SSD tier size", type=float, default=0.0),
    "compress": Setting("--compress", "lz4 on the SSD tier", switch=True, default=False),
    # The gateway's HTTP edge.
    "served_model_name": Setting(
        "--served-model-name",
        "the names clients use for the model, e.g. `--served-model-name smol chat`: the "
        "first is the one responses and GET /v1/models report, all are accepted (default: "
        "--model; a known model's Hugging Face repo id is always accepted too)",
        default=(),
        many=True,
    ),
    "api_key": Setting(
        "--api-key",
        "require this bearer key (env KVSTACK_API_KEY)",
        default="",
        env="KVSTACK_API_KEY",
    ),
    "api_key_file": Setting(
        "--api-key-file",
        "require the bearer key in this file (env KVSTACK_API_KEY_FILE; `kvstack auth init` "
        "writes one to DIR/api-key)",
        default="",
        env="KVSTACK_API_KEY_FILE",
    ),
    "max_tokens_limit": Setting("--max-tokens-limit", "0: the context size", type=int, default=0),
    "read_timeout": Setting(
        "--read-timeout",
        "seconds a client has to send a request's headers, and then its body; a stalled "
        "one is cut off",
        type=float,
        default=30.0,
    ),
    "max_concurrent_per_key": Setting(
        "--max-concurrent-per-key",
        "generation requests in flight per API key; more get 429 (0: no limit)",
        type=int,
        default=0,
    ),
    "cors_origins": Setting(
        "--cors-origins",
        "comma-separated browser origins allowed to call the API (* for any; default: CORS off)",
        default="",
    ),
    # How the gateway moves a request off a worker that was lost.
    "migration_limit": Setting(
        "--migration-limit",
        "times a streaming request may move to another worker after tokens arrived (its "
        "worker died or stopped); then it ends with an error",
        type=int,
        default=_timeouts.migration_limit,
    ),
    "placement_wait": Setting(
        "--placement-wait",
        "seconds a request waits for a conductor or a live worker (a restart) before it gets 503",
        type=float,
        default=_timeouts.placement_wait,
    ),
    # The conductor's scheduling (docs/conductor.md), shared with `loadgen sim`.
    **SCHEDULING_SETTINGS,
    "cost_model": Setting(
        "--cost-model",
        "a file from `kvstack profile`, or roofline:<model>:<hardware>; auto: the profile "
        "of --model if there is one",
        default="auto",
    ),
    "lease_ttl": Setting(
        "--lease-ttl",
        "seconds: conductors elect the active one by a lease in NATS JetStream, and a "
        "standby takes over about this long after the active one stops (0: no lease, the "
        "only conductor; docs/conductor.md)",
        type=float,
        default=0.0,
    ),
    # `kvstack up` alone: the shape of the stack and where it keeps its files.
    "num_conductors": Setting(
        "--conductors",
        "conductors: one active, the others standing by to take over (more than 1: "
        "elected by --lease-ttl)",
        type=int,
        default=1,
    ),
    "num_prefill": Setting("--prefill", "number of prefill workers", type=int, default=1),
    "num_decode": Setting("--decode", "number of decode workers", type=int, default=1),
    "num_kvstore": Setting(
        "--kvstore",
        "kvstore instances (0: none; none with --kv-pool mooncake)",
        type=int,
        default=1,
    ),
    "kvstore_dram_gib": Setting(
        "--kvstore-dram-gib", "per kvstore instance", type=float, default=2.0
    ),
    "attention_group_size": Setting(
        "--attention-workers",
        "attention workers per decode worker (0: attention stays in decode); must divide "
        "the model's KV heads",
        type=int,
        default=0,
    ),
    "port": Setting("--port", type=int, default=8000),
    "secrets_dir": Setting(
        "--secrets-dir",
        "NATS credentials (one user per service, each allowed only its own subjects), "
        "nats-server's config and the data plane's secret; made on first start, reused "
        "after (docs/security.md)",
        default=".kvstack/secrets",
    ),
    "nats_cluster": Setting(
        "--nats-cluster",
        "run NATS as a cluster of this many nats-server nodes routed on loopback (3 or "
        "more; every service gets every node's URL and survives the loss of one; routes "
        "authenticate with a password in --secrets-dir); 1: one server",
        type=int,
        default=1,
    ),
    "nats_tls": Setting(
        "--nats-tls",
        "TLS on NATS with a CA of this deployment's own (in --secrets-dir)",
        switch=True,
        default=False,
    ),
    "log_dir": Setting(
        "--log-dir",
        "one log per service; the previous run's is kept as NAME.log.1",
        default=".kvstack/logs",
    ),
    "metrics_port": Setting(
        "--metrics-port",
        "kvstack up's own /metrics (restarts, children up) on --host (default: the base "
        "port; 0: a free port, printed at start)",
        type=int,
    ),
    "base_port": Setting(
        "--base-port",
        "every service's HTTP (/health, /metrics) at a fixed port from here: kvstack up "
        "+0, conductor-i +1+i, kvstore-i +10+i, prefill-i +100+i, decode-i +200+i, attention "
        "workers +300+k (docs/observability.md); 0: each on a free port",
        type=int,
        default=8100,
    ),
    "prometheus_config": Setting(
        "--prometheus-config",
        "write a Prometheus config scraping every service here at start (fixed ports only)",
        default=".kvstack/prometheus.yml",
    ),
}

COMMON = (
    "nats",
    "worker_id",
    "host",
    "http_port",
    "heartbeat_interval",
    "drain_timeout",
    "otlp_endpoint",
)
SECURITY = ("nats_creds", "nats_tls_ca", "data_token_file", "insecure")
ENGINE = ("engine", "mock_model", "mock_hardware", "mock_kv_scale", "max_model_len")
DATA_PLANE = ("data_host", "data_port", "advertise_data_addr", "data_encrypt", "no_shared_memory")
KV_POOL = ("kv_pool", "mooncake_segment_gib", "mooncake_replicas")
WORKER = (
    *COMMON,
    *SECURITY,
    "model",
    "device",
    "dtype",
    "weights",
    "activations",
    "prefill_weights",
    "block_size",
    "kv_cache_gib",
    "max_num_batched_tokens",
    "max_num_seqs",
    "long_prefill_tokens",
    "threads",
    "cores",
    "no_prefix_cache",
    "no_fused_decode",
    "decode_burst",
    *DATA_PLANE,
    "transport",
    *KV_POOL,
    "mooncake_master",
    *ENGINE,
)
OFFLOAD = ("attention_workers", "micro_batches", "attention_recovery_timeout")
DECODE = ("no_pool_prefix", *OFFLOAD)
RELIABILITY = ("migration_limit", "placement_wait")
SCHEDULING = (*SCHEDULING_SETTINGS, "cost_model", "model")
FAILOVER = ("lease_ttl",)

# Which settings each command takes, in the order of its --help.
COMMAND_SETTINGS: dict[str, tuple[str, ...]] = {
    "conductor": (*COMMON, *SECURITY, *SCHEDULING, *FAILOVER),
    "prefill": WORKER,
    "decode": (*WORKER, *DECODE),
    "attention-worker": (
        *COMMON,
        *SECURITY,
        "kv_cache_gib",
        "threads",
        "cores",
        "data_host",
        "data_port",
        "data_encrypt",
        "link_port",
        "advertise_host",
    ),
    "kvstore": (
        *COMMON,
        *SECURITY,
        "dram_gib",
        "disk_dir",
        "disk_gib",
        "compress",
        *DATA_PLANE,
    ),
    "gateway": (
        *COMMON,
        *SECURITY,
        "model",
        "served_model_name",
        "api_key",
        "api_key_file",
        "max_tokens_limit",
        "dtype",
        "weights",
        "activations",
        "block_size",
        "read_timeout",
        "max_concurrent_per_key",
        "cors_origins",
        *RELIABILITY,
        *ENGINE,
    ),
    "up": (
        "nats",
        "num_conductors",
        "lease_ttl",
        "num_prefill",
        "num_decode",
        "num_kvstore",
        "kvstore_dram_gib",
        *KV_POOL,
        "no_shared_memory",
        "mooncake_master_args",
        "attention_group_size",
        "micro_batches",
        "model",
        "device",
        "gpus",
        "dtype",
        "weights",
        "activations",
        "prefill_weights",
        "host",
        "port",
        "base_port",
        "kv_cache_gib",
        "threads",
        "cores",
        "max_num_seqs",
        "max_num_batched_tokens",
        "long_prefill_tokens",
        "decode_burst",
        *ENGINE,
        *RELIABILITY,
        "served_model_name",
        "api_key",
        "secrets_dir",
        "nats_cluster",
        "nats_tls",
        "insecure",
        "log_dir",
        "metrics_port",
        "prometheus_config",
        "drain_timeout",
        "otlp_endpoint",
        "policy",
        "admission",
        "slo_ttft",
        "slo_tbt",
    ),
    "serve": (
        "model",
        "served_model_name",
        "host",
        "port",
        "api_key",
        "insecure",
        "secrets_dir",
        "dtype",
        "weights",
        "activations",
        "prefill_weights",
        "device",
        "attention",
        "block_size",
        "kv_cache_gib",
        "max_num_seqs",
        "max_num_batched_tokens",
        "long_prefill_tokens",
        "threads",
        "decode_threads",
        "cores",
        "no_prefix_cache",
        "no_fused_decode",
        "decode_burst",
        "no_cuda_graphs",
        *ENGINE,
        "max_tokens_limit",
        "read_timeout",
        "max_concurrent_per_key",
        "cors_origins",
        "drain_timeout",
        "otlp_endpoint",
    ),
}

# Where a command means a setting a little differently: another default or help.
COMMAND_CHANGES: dict[str, dict[str, dict[str, Any]]] = {
    "gateway": {
        "http_port": {"default": 8000},
        "insecure": {
            "help": "run without credentials (env KVSTACK_INSECURE=1): on a NATS server that "
            "lets anyone in, and without an API key even where --host is not loopback"
        },
        "model": {"help": "the model the workers serve"},
        "dtype": {"help": "the workers' dtype (names KV blocks)"},
        "block_size": {"help": "the workers' block size"},
    },
    "conductor": {"model": {"help": "the model the workers serve"}},
    "serve": {
        "api_key": {
            "help": "require this bearer key (env KVSTACK_API_KEY; default: a key made on "
            "first start and kept in --secrets-dir/api-key)"
        },
        "insecure": {"env": "", "help": "no API key: anyone who reaches --host:--port may use it"},
        "secrets_dir": {"help": "where the API key made when none is given is kept"},
        "kv_cache_gib": {"help": "KV cache size in GiB"},
        "threads": {
            "help": "torch threads (default: one per core of --cores, or of every core this "
            "process may use)"
        },
        "cores": {
            "help": "pin the process to these CPU cores, e.g. 0-3,8 (default: not pinned, "
            "on every core it may use)"
        },
    },
    "attention-worker": {
        "kv_cache_gib": {"help": "KV pool size in GiB"},
        "data_host": {"help": "bind address of the KV data plane and the attention link"},
        "data_port": {"help": "KV from prefill workers"},
    },
    "up": {
        "nats": {"default": "", "env": "", "help": "use this NATS server instead of starting one"},
        "host": {"help": "the gateway's address (and that of kvstack up's /metrics)"},
        "kv_cache_gib": {"help": "per worker"},
        "threads": {
            "help": "torch threads per model worker (default: one per core of its share of --cores)"
        },
        "cores": {
            "help": "the cores the model workers (prefill, decode, attention workers) share "
            "out (default: all this process may use): each gets a run of its own, as even as "
            "they go, when there are at least as many cores as workers, else one core each, "
            "dealt round-robin; the gateway, conductor and kvstores are not pinned"
        },
        "max_num_seqs": {"help": "per worker (decode batch)"},
        "max_num_batched_tokens": {"help": "per worker and step (the prefill chunk)"},
        "micro_batches": {"help": "when offloading attention"},
        "api_key": {
            "env": "",
            "help": "require this bearer key at the gateway (default: a key made on first "
            "start and kept in --secrets-dir/api-key)",
        },
        "insecure": {
            "env": "",
            "help": "no credentials: NATS lets anyone on this host in, the data plane takes "
            "any peer, the gateway wants no API key (for experiments only)",
        },
        "slo_ttft": {"help": "seconds"},
        "slo_tbt": {"help": "seconds"},
        "lease_ttl": {
            "default": 1.0,
            "help": "with --conductors above 1: seconds a standby "
            "waits for the active conductor's lease to expire",
        },
    },
}

# The settings `kvstack up` hands on to its children, by child command; each child takes
# them under the same name (the few renamed ones, e.g. --kvstore-dram-gib becoming a
# kvstore's --dram-gib, `up.py` passes itself).
WORKER_TUNING = (
    "device",
    "dtype",
    "weights",
    "activations",
    "prefill_weights",
    "kv_cache_gib",
    "threads",
    "max_num_seqs",
    "max_num_batched_tokens",
    "long_prefill_tokens",
    "max_model_len",
    "decode_burst",
)
FORWARDED_BY_UP: dict[str, tuple[str, ...]] = {
    "conductor": ("model", "policy", "admission", "slo_ttft", "slo_tbt"),
    "prefill": (*WORKER_TUNING, *KV_POOL, "no_shared_memory"),
    "decode": (*WORKER_TUNING, *KV_POOL, "no_shared_memory"),
    "kvstore": ("no_shared_memory",),
    "attention-worker": ("kv_cache_gib", "threads"),
    "gateway": (
        "dtype",
        "weights",
        "activations",
        "max_model_len",
        *RELIABILITY,
        "served_model_name",
        "api_key",
    ),
}


def add_command(parser: argparse.ArgumentParser, command: str) -> None:
    """Every setting of `command`, as it means them."""
    setting.add(parser, SETTINGS, COMMAND_SETTINGS[command], COMMAND_CHANGES.get(command))


def flags(**values: Any) -> list[str]:
    """Command-line words giving these settings (by name) these values; unset ones (None,
    empty, a switch off) are left out."""
    return [word for name, value in values.items() for word in SETTINGS[name].argv(value)]


def forward(args: argparse.Namespace, names: Iterable[str]) -> tuple[str, ...]:
    """The command-line words that hand the parsed values of `names` on to a child."""
    return tuple(flags(**{name: getattr(args, SETTINGS[name].dest) for name in names}))
