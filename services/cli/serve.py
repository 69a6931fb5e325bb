"""`kvstack conductor|prefill|decode|gateway`: run one service in this process."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os

from services.gateway.backend import BackendTimeouts
from shared.auth.credentials import load_auth
from shared.auth.deployment import read_data_token
from shared.costmodel import HARDWARE, MODELS
from shared.engine.config import DTYPE_CHOICES
from shared.engine.mock import ENGINES, MOCK_MAX_MODEL_LEN, MockSpec
from shared.errors import KvstackError
from shared.model.registry import DEFAULT_MODEL
from shared.service import run
from shared.transfer.factory import TRANSPORTS
from shared.worker import WorkerConfig

log = logging.getLogger("kvstack.cli")


def add_common(p: argparse.ArgumentParser, http_port: int = 0) -> None:
    p.add_argument(
        "--nats",
        default=os.environ.get("KVSTACK_NATS", "nats://127.0.0.1:4222"),
        help="NATS server URL (env KVSTACK_NATS)",
    )
    p.add_argument("--worker-id", default="", help="default: <service>-<host>-<pid>")
    p.add_argument("--host", default="127.0.0.1", help="HTTP bind address")
    p.add_argument("--http-port", type=int, default=http_port, help="0: any free port")
    p.add_argument("--heartbeat-interval", type=float, default=1.0)
    p.add_argument("--drain-timeout", type=float, default=30.0)
    add_security(p)


def add_security(p: argparse.ArgumentParser) -> None:
    """Credentials of the control bus and the data plane (docs/security.md)."""
    env = os.environ.get
    p.add_argument(
        "--nats-creds",
        default=env("KVSTACK_NATS_CREDS", ""),
        help="this service's NATS credentials file (env KVSTACK_NATS_CREDS; made by "
        "`kvstack up` or `kvstack auth init`)",
    )
    p.add_argument(
        "--nats-tls-ca",
        default=env("KVSTACK_NATS_TLS_CA", ""),
        help="verify the NATS server's TLS certificate against this CA (PEM; env "
        "KVSTACK_NATS_TLS_CA)",
    )
    p.add_argument(
        "--data-token-file",
        default=env("KVSTACK_DATA_TOKEN_FILE", ""),
        help="the data plane's shared secret, from a file (env "
        "KVSTACK_DATA_TOKEN_FILE; or the secret itself in KVSTACK_DATA_TOKEN)",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        default=env("KVSTACK_INSECURE", "") not in ("", "0"),
        help="run without credentials: on a NATS server that lets anyone in, with "
        "an unauthenticated data plane (env KVSTACK_INSECURE=1)",
    )


def add_worker(p: argparse.ArgumentParser) -> None:
    add_common(p)
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--kv-cache-gib", type=float, default=1.0, help="KV cache size in GiB")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument(
        "--long-prefill-tokens",
        type=int,
        default=None,
        help="most prompt tokens one request computes per step while others "
        "prefill too (default: max(block size, max-num-batched-tokens / 4); "
        "0: no limit, a long prompt may hold the whole step)",
    )
    p.add_argument("--threads", type=int, default=None, help="torch threads (1-2 on CPU)")
    p.add_argument(
        "--no-prefix-cache",
        action="store_true",
        help="no local prefix cache (reuse only through the kvstore pool)",
    )
    p.add_argument("--data-host", default="127.0.0.1", help="data-plane bind address")
    p.add_argument("--data-port", type=int, default=0)
    p.add_argument("--advertise-data-addr", default="", help="host:port peers should dial")
    p.add_argument(
        "--transport",
        choices=TRANSPORTS,
        default="tcp",
        help="data plane of the prefill -> decode KV stream",
    )
    add_engine(p)


def add_engine(p: argparse.ArgumentParser) -> None:
    """The engine flags; the gateway takes them too (the mock model names the KV blocks)."""
    p.add_argument(
        "--engine",
        choices=ENGINES,
        default="torch",
        help="torch: run --model; mock: no model, each step takes the cost model's "
        "time for --mock-model on --mock-hardware (--model gives the tokenizer)",
    )
    p.add_argument(
        "--mock-model",
        default=None,
        help=f"the model a mock worker stands in for ({', '.join(MODELS)}; "
        f"default {MockSpec.model})",
    )
    p.add_argument(
        "--mock-hardware",
        default=None,
        help=f"the instance it runs on ({', '.join(HARDWARE)}; default {MockSpec.hardware})",
    )
    p.add_argument(
        "--mock-kv-scale",
        type=float,
        default=None,
        help=f"KV bytes stored and moved, relative to the real model's (default "
        f"{MockSpec.kv_scale:g}: llama3-70b's 320 KiB per token become 320 B)",
    )
    p.add_argument(
        "--max-model-len",
        type=int,
        default=0,
        help=f"context limit in tokens (0: the model's; mock: {MOCK_MAX_MODEL_LEN})",
    )


def engine_options(args: argparse.Namespace) -> dict:
    """mock (a MockSpec for --engine mock, else None) and max_model_len, checked."""
    if args.max_model_len < 0:
        raise KvstackError(f"--max-model-len must not be negative, got {args.max_model_len}")
    given = {
        field: value
        for field, value in (
            ("model", args.mock_model),
            ("hardware", args.mock_hardware),
            ("kv_scale", args.mock_kv_scale),
        )
        if value is not None
    }
    if args.engine != "mock" and given:
        raise KvstackError("--mock-model, --mock-hardware and --mock-kv-scale need --engine mock")
    mock = MockSpec(**given) if args.engine == "mock" else None
    return dict(mock=mock, max_model_len=args.max_model_len or None)


def add_offload(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--attention-workers",
        default="",
        help="offload attention to this group of attention-worker ids (comma-"
        "separated; the group size must divide the model's KV heads)",
    )
    p.add_argument(
        "--micro-batches",
        type=int,
        default=2,
        help="staggered micro-batches per step when offloading (1: no overlap)",
    )
    p.add_argument(
        "--attention-recovery-timeout",
        type=float,
        default=30.0,
        help="seconds to wait for attention workers to re-form a lost group",
    )


def offload_config(args: argparse.Namespace) -> dict:
    if args.micro_batches < 1:
        raise KvstackError(f"--micro-batches must be at least 1, got {args.micro_batches}")
    workers = tuple(w.strip() for w in args.attention_workers.split(",") if w.strip())
    return dict(
        attention_workers=workers,
        micro_batches=args.micro_batches,
        attention_recovery_timeout=args.attention_recovery_timeout,
    )


def common_config(args: argparse.Namespace) -> dict:
    return dict(
        nats_url=args.nats,
        worker_id=args.worker_id,
        host=args.host,
        http_port=args.http_port,
        heartbeat_interval=args.heartbeat_interval,
        drain_timeout=args.drain_timeout,
        nats_auth=load_auth(args.nats_creds, args.nats_tls_ca, args.insecure),
    )


def data_token(args: argparse.Namespace) -> str:
    """The data plane's secret: required, unless --insecure."""
    token = os.environ.get("KVSTACK_DATA_TOKEN", "")
    if not token and args.data_token_file:
        token = read_data_token(args.data_token_file)
    if not token and not args.insecure:
        raise KvstackError(
            "the data plane needs a shared secret: KVSTACK_DATA_TOKEN, or "
            "--data-token-file (`kvstack auth init` makes one), or --insecure"
        )
    return token


def worker_config(args: argparse.Namespace) -> WorkerConfig:
    return WorkerConfig(
        **common_config(args),
        model=args.model,
        dtype=args.dtype,
        block_size=args.block_size,
        kv_cache_bytes=int(args.kv_cache_gib * (1 << 30)),
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        long_prefill_tokens=args.long_prefill_tokens,
        num_threads=args.threads,
        enable_prefix_cache=not args.no_prefix_cache,
        data_host=args.data_host,
        data_port=args.data_port,
        advertise_data_addr=args.advertise_data_addr,
        transport=args.transport,
        data_token=data_token(args),
        **engine_options(args),
    )


def add_parser(sub: argparse._SubParsersAction) -> None:
    conductor = sub.add_parser("conductor", help="run the conductor (placement)")
    add_common(conductor)
    add_scheduling(conductor)
    conductor.set_defaults(run=run_conductor)
    for name, runner in (("prefill", run_prefill), ("decode", run_decode)):
        p = sub.add_parser(name, help=f"run a {name} worker")
        add_worker(p)
        p.set_defaults(run=runner)
    add_offload(p)  # the decode worker's
    attention = sub.add_parser(
        "attention-worker",
        help="run an attention worker (holds KV "
        "of offloaded decode requests, computes their attention)",
    )
    add_common(attention)
    attention.add_argument("--kv-cache-gib", type=float, default=1.0, help="KV pool size in GiB")
    attention.add_argument("--threads", type=int, default=None, help="torch threads (1-2 on CPU)")
    attention.add_argument(
        "--data-host",
        default="127.0.0.1",
        help="bind address of the KV data plane and the attention link",
    )
    attention.add_argument("--data-port", type=int, default=0, help="KV from prefill workers")
    attention.add_argument("--link-port", type=int, default=0, help="the decode worker's link")
    attention.add_argument("--advertise-host", default="", help="host peers should dial")
    attention.set_defaults(run=run_attention_worker)
    kvstore = sub.add_parser("kvstore", help="run a kvstore instance (KV blocks in DRAM/SSD)")
    add_common(kvstore)
    kvstore.add_argument("--dram-gib", type=float, default=4.0, help="DRAM tier size")
    kvstore.add_argument("--disk-dir", default="", help="SSD tier directory (empty: none)")
    kvstore.add_argument("--disk-gib", type=float, default=0.0, help="SSD tier size")
    kvstore.add_argument("--compress", action="store_true", help="lz4 on the SSD tier")
    kvstore.add_argument("--data-host", default="127.0.0.1", help="data-plane bind address")
    kvstore.add_argument("--data-port", type=int, default=0)
    kvstore.add_argument("--advertise-data-addr", default="", help="host:port peers should dial")
    kvstore.set_defaults(run=run_kvstore)
    gateway = sub.add_parser("gateway", help="run the OpenAI-compatible HTTP gateway")
    add_common(gateway, http_port=8000)
    gateway.add_argument("--model", default=DEFAULT_MODEL, help="the model the workers serve")
    gateway.add_argument("--served-model-name", default="", help="name clients use")
    gateway.add_argument(
        "--api-key",
        default=os.environ.get("KVSTACK_API_KEY", ""),
        help="require this bearer key (env KVSTACK_API_KEY)",
    )
    gateway.add_argument("--max-tokens-limit", type=int, default=0, help="0: the context size")
    gateway.add_argument(
        "--dtype",
        choices=DTYPE_CHOICES,
        default="auto",
        help="the workers' dtype (names KV blocks)",
    )
    gateway.add_argument("--block-size", type=int, default=16, help="the workers' block size")
    gateway.add_argument(
        "--read-timeout",
        type=float,
        default=30.0,
        help="seconds a client has to send a request's headers, and then "
        "its body; a stalled one is cut off",
    )
    gateway.add_argument(
        "--max-concurrent-per-key",
        type=int,
        default=0,
        help="generation requests in flight per API key; more get 429 (0: no limit)",
    )
    gateway.add_argument(
        "--cors-origins",
        default="",
        help="comma-separated browser origins allowed to call the API "
        "(* for any; default: CORS off)",
    )
    add_reliability(gateway)
    add_engine(gateway)
    gateway.set_defaults(run=run_gateway)


def add_reliability(p: argparse.ArgumentParser) -> None:
    """How the gateway moves a request off a worker that was lost (`kvstack up` too)."""
    d = BackendTimeouts()
    p.add_argument(
        "--migration-limit",
        type=int,
        default=d.migration_limit,
        help="times a streaming request may move to another worker after tokens "
        "arrived (its worker died or stopped); then it ends with an error",
    )
    p.add_argument(
        "--placement-wait",
        type=float,
        default=d.placement_wait,
        help="seconds a request waits for a conductor or a live worker (a restart) "
        "before it gets 503",
    )


def backend_timeouts(args: argparse.Namespace) -> BackendTimeouts:
    if args.migration_limit < 0 or args.placement_wait < 0:
        raise KvstackError("--migration-limit and --placement-wait must not be negative")
    return BackendTimeouts(migration_limit=args.migration_limit, placement_wait=args.placement_wait)


def add_scheduling(p: argparse.ArgumentParser) -> None:
    from shared.conductor.config import ADMISSION_MODES, POLICY_NAMES, SchedulingConfig

    d = SchedulingConfig()
    p.add_argument("--policy", choices=POLICY_NAMES, default=d.policy)
    p.add_argument(
        "--admission",
        choices=ADMISSION_MODES,
        default=d.admission,
        help="how overload is refused (see docs/conductor.md)",
    )
    p.add_argument("--slo-ttft", type=float, default=d.slo_ttft, help="seconds (default SLO)")
    p.add_argument("--slo-tbt", type=float, default=d.slo_tbt, help="seconds (default SLO)")
    p.add_argument(
        "--balancing-threshold",
        type=float,
        default=d.balancing_threshold,
        help="kvcentric loads a remote prefix when it is this many times the local",
    )
    p.add_argument(
        "--decode-time",
        type=float,
        default=d.decode_time,
        help="predictive admission's uniform decode seconds, until learned",
    )
    p.add_argument(
        "--cost-model",
        default="auto",
        help="a file from `kvstack profile`, or "
        "roofline:<model>:<hardware>; auto: the profile of --model if there is one",
    )
    p.add_argument("--model", default=DEFAULT_MODEL, help="the model the workers serve")


def run_conductor(args: argparse.Namespace) -> int:
    from services.conductor.service import ConductorConfig, ConductorService
    from shared.conductor.config import SchedulingConfig

    scheduling = SchedulingConfig(
        args.policy,
        args.admission,
        args.slo_ttft,
        args.slo_tbt,
        args.balancing_threshold,
        args.decode_time,
    )
    cost = conductor_cost_model(args.cost_model, args.model)
    config = ConductorConfig(
        **common_config(args), scheduling=scheduling, cost_model=args.cost_model
    )
    return run(ConductorService(config, cost))


def conductor_cost_model(spec: str, model: str):
    """The cost model named by `spec`; "auto" is the profile `kvstack profile` saved for
    `model`, or the roofline of this CPU when there is none."""
    from shared import costmodel

    if spec != "auto":
        return costmodel.from_spec(spec)
    from services.cli.profile import default_path

    path = default_path(model)
    if path.is_file():
        return costmodel.load(path)
    log.info("no profile at %s (run `kvstack profile`); using the CPU roofline", path)
    return cpu_roofline(model)


def cpu_roofline(model: str):
    """The roofline of `model`'s own shape on this CPU; SmolLM2's when its files are not
    reachable from here (a conductor may run where the weights are not)."""
    from shared.costmodel import HARDWARE, ModelShape, RooflineCostModel, roofline
    from shared.model.config import ModelConfig
    from shared.model.registry import resolve_model

    try:
        config = ModelConfig.from_dir(resolve_model(model))
    except KvstackError as e:
        log.warning("cannot read %s's config (%s); predicting with SmolLM2's shape", model, e)
        return roofline("smollm2-135m", "cpu")
    return RooflineCostModel(ModelShape.of(config, model), HARDWARE["cpu"])


def run_prefill(args: argparse.Namespace) -> int:
    from services.prefill.service import PrefillService

    return run(PrefillService(worker_config(args)))


def run_decode(args: argparse.Namespace) -> int:
    from services.decode.service import DecodeService

    config = dataclasses.replace(worker_config(args), **offload_config(args))
    return run(DecodeService(config))


def run_attention_worker(args: argparse.Namespace) -> int:
    from services.attention_worker.service import AttentionWorkerConfig, AttentionWorkerService

    config = AttentionWorkerConfig(
        **common_config(args),
        kv_cache_bytes=int(args.kv_cache_gib * (1 << 30)),
        num_threads=args.threads,
        data_host=args.data_host,
        data_port=args.data_port,
        link_port=args.link_port,
        advertise_host=args.advertise_host,
        data_token=data_token(args),
    )
    return run(AttentionWorkerService(config))


def run_kvstore(args: argparse.Namespace) -> int:
    from services.kvstore.service import KvstoreConfig, KvstoreService

    if args.disk_gib > 0 and not args.disk_dir:
        raise KvstackError("--disk-gib needs --disk-dir")
    if args.dram_gib < 0 or args.disk_gib < 0:
        raise KvstackError("--dram-gib and --disk-gib must not be negative")
    config = KvstoreConfig(
        **common_config(args),
        dram_bytes=int(args.dram_gib * (1 << 30)),
        disk_dir=args.disk_dir,
        disk_bytes=int(args.disk_gib * (1 << 30)),
        compress=args.compress,
        data_host=args.data_host,
        data_port=args.data_port,
        advertise_data_addr=args.advertise_data_addr,
        data_token=data_token(args),
    )
    return run(KvstoreService(config))


def run_gateway(args: argparse.Namespace) -> int:
    from services.gateway.cors import parse_origins
    from services.gateway.edge import EdgeConfig
    from services.gateway.service import GatewayConfig, GatewayService

    engine = engine_options(args)
    edge = EdgeConfig(
        read_timeout=args.read_timeout,
        max_concurrent_per_key=args.max_concurrent_per_key,
        cors_origins=parse_origins(args.cors_origins),
    )
    config = GatewayConfig(
        **common_config(args),
        model=args.model,
        served_model_name=args.served_model_name,
        api_key=args.api_key,
        max_tokens_limit=args.max_tokens_limit,
        dtype=args.dtype,
        block_size=args.block_size,
        mock=engine["mock"],
        max_model_len=engine["max_model_len"] or 0,
        timeouts=backend_timeouts(args),
        edge=edge,
    )
    return run(GatewayService(config))
