"""`kvstack conductor|prefill|decode|attention-worker|kvstore|gateway`: run one service in
this process. Their flags are defined once, in `settings.py`."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os

from services import settings
from services.gateway.api_key import gateway_api_key
from services.gateway.backend import BackendTimeouts
from services.stack.pinning import pin
from shared.auth.credentials import load_auth
from shared.auth.deployment import read_data_token
from shared.engine.mock import MockSpec
from shared.errors import KvstackError
from shared.kvpool.mooncake_store import MooncakeStoreConfig
from shared.runtime.service import run
from shared.worker.config import WorkerConfig

log = logging.getLogger("kvstack.cli")


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


def decode_config(args: argparse.Namespace) -> dict:
    """What only a decode worker is configured with: the pool's prefixes, attention offload."""
    if args.micro_batches < 1:
        raise KvstackError(f"--micro-batches must be at least 1, got {args.micro_batches}")
    workers = tuple(w.strip() for w in args.attention_workers.split(",") if w.strip())
    return dict(
        take_pool_prefix=not args.no_pool_prefix,
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
        otlp_endpoint=args.otlp_endpoint,
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
        device=args.device,
        dtype=args.dtype,
        weights=args.weights,
        activations=args.activations,
        prefill_weights=args.prefill_weights,
        block_size=args.block_size,
        kv_cache_bytes=int(args.kv_cache_gib * (1 << 30)),
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        long_prefill_tokens=args.long_prefill_tokens,
        num_threads=args.threads,
        enable_prefix_cache=not args.no_prefix_cache,
        fused_decode=not args.no_fused_decode,
        decode_burst=args.decode_burst,
        data_host=args.data_host,
        data_port=args.data_port,
        advertise_data_addr=args.advertise_data_addr,
        transport=args.transport,
        data_token=data_token(args),
        data_encrypt=args.data_encrypt,
        shared_memory=not args.no_shared_memory,
        mooncake=mooncake_config(args),
        **engine_options(args),
    )


def mooncake_config(args: argparse.Namespace) -> MooncakeStoreConfig | None:
    """--kv-pool mooncake: where the store is and what this worker lends it."""
    if args.kv_pool != "mooncake":
        return None
    if not args.mooncake_master:
        raise KvstackError("--kv-pool mooncake needs --mooncake-master host:port")
    return MooncakeStoreConfig(
        args.mooncake_master,
        local_hostname=args.advertise_data_addr.rpartition(":")[0] or args.data_host,
        segment_bytes=int(args.mooncake_segment_gib * (1 << 30)),
        replicas=args.mooncake_replicas,
    )


def add_parser(sub: argparse._SubParsersAction) -> None:
    for command, runner, help in (
        ("conductor", run_conductor, "run the conductor (placement)"),
        ("prefill", run_prefill, "run a prefill worker"),
        ("decode", run_decode, "run a decode worker"),
        (
            "attention-worker",
            run_attention_worker,
            (
                "run an attention worker (holds KV of offloaded decode requests, computes "
                "their attention)"
            ),
        ),
        ("kvstore", run_kvstore, "run a kvstore instance (KV blocks in DRAM/SSD)"),
        ("gateway", run_gateway, "run the OpenAI-compatible HTTP gateway"),
    ):
        p = sub.add_parser(command, help=help)
        settings.add_command(p, command)
        p.set_defaults(run=runner)


def backend_timeouts(args: argparse.Namespace) -> BackendTimeouts:
    if args.migration_limit < 0 or args.placement_wait < 0:
        raise KvstackError("--migration-limit and --placement-wait must not be negative")
    return BackendTimeouts(migration_limit=args.migration_limit, placement_wait=args.placement_wait)


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
        **common_config(args),
        scheduling=scheduling,
        cost_model=args.cost_model,
        lease_ttl=args.lease_ttl,
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


def pin_threads(args: argparse.Namespace) -> None:
    """Pin this process to --cores; --threads, unset, becomes one per core."""
    args.threads = pin(args.cores, args.threads)


def run_prefill(args: argparse.Namespace) -> int:
    from services.prefill.service import PrefillService

    pin_threads(args)
    return run(PrefillService(worker_config(args)))


def run_decode(args: argparse.Namespace) -> int:
    from services.decode.service import DecodeService

    pin_threads(args)
    config = dataclasses.replace(worker_config(args), **decode_config(args))
    return run(DecodeService(config))


def run_attention_worker(args: argparse.Namespace) -> int:
    from services.attention_worker.service import AttentionWorkerConfig, AttentionWorkerService

    pin_threads(args)
    config = AttentionWorkerConfig(
        **common_config(args),
        kv_cache_bytes=int(args.kv_cache_gib * (1 << 30)),
        num_threads=args.threads,
        data_host=args.data_host,
        data_port=args.data_port,
        link_port=args.link_port,
        advertise_host=args.advertise_host,
        data_token=data_token(args),
        data_encrypt=args.data_encrypt,
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
        data_encrypt=args.data_encrypt,
        shared_memory=not args.no_shared_memory,
    )
    return run(KvstoreService(config))


def edge_config(args: argparse.Namespace):
    """The gateway's HTTP edge: read timeout, per-key concurrency, CORS origins."""
    from services.gateway.cors import parse_origins
    from services.gateway.edge import EdgeConfig

    return EdgeConfig(
        read_timeout=args.read_timeout,
        max_concurrent_per_key=args.max_concurrent_per_key,
        cors_origins=parse_origins(args.cors_origins),
    )


def run_gateway(args: argparse.Namespace) -> int:
    from services.gateway.service import GatewayConfig, GatewayService

    engine = engine_options(args)
    config = GatewayConfig(
        **common_config(args),
        model=args.model,
        served_model_names=tuple(args.served_model_name),
        api_key=gateway_api_key(args),
        max_tokens_limit=args.max_tokens_limit,
        dtype=args.dtype,
        weights=args.weights,
        activations=args.activations,
        block_size=args.block_size,
        mock=engine["mock"],
        max_model_len=engine["max_model_len"] or 0,
        timeouts=backend_timeouts(args),
        edge=edge_config(args),
    )
    return run(GatewayService(config))
