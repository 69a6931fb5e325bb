"""`kvstack serve`: the OpenAI-compatible API and one engine in this process, prefilling
and decoding in the same steps on every core the process may use; no NATS, no other
process (`services/colocated/`). The disaggregated stack (`kvstack up`) is the shape
for more than one machine; on one machine this one gives the model all the cores."""

from __future__ import annotations

import argparse
from pathlib import Path

from services import settings
from services.cli.service import edge_config, engine_options
from services.stack.pinning import pin
from services.stack.stack import say
from shared.auth.deployment import ensure_api_key
from shared.errors import KvstackError
from shared.runtime.service import run


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="serve the OpenAI API from one process and one engine (one machine)",
        description="Serve --model behind the gateway's OpenAI-compatible API from this "
        "process alone: one engine prefills and decodes in the same steps (chunked "
        "prefill) with one torch thread per core it may use (--cores, --threads; "
        "--decode-threads for steps that only decode). Every "
        "request wants an API key: --api-key, else one made on first start and kept in "
        "--secrets-dir/api-key (--insecure: none). For more than one machine use "
        "`kvstack up` and the services it runs.",
    )
    settings.add_command(p, "serve")
    p.set_defaults(run=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    from services.colocated.service import ColocatedService

    # NOTE: decode steps take every core too. One core was left to the front end once (2
    # cores: decode batch 1 55.6 tok/s on 2 threads, 76.7 on 1), measured while the engine
    # was built on one thread and stepped on another, where libgomp throttles both teams
    # (shared/engine/engine_thread.py); built where it steps, 2 threads decode 1.7x faster
    # than 1 and serve lower TPOTs (docs/notes/2026-11-28-avx2-only-cpu.md, "An AVX2-only CPU").
    prefill_threads = pin(args.cores, args.threads)  # before any thread starts
    threads = decode_threads(args, prefill_threads)
    return run(ColocatedService(colocated_config(args, threads, prefill_threads)))


def decode_threads(args: argparse.Namespace, threads: int) -> int:
    """--decode-threads, else the threads every other step gets."""
    if args.decode_threads is None:
        return threads
    if args.decode_threads < 1:
        raise KvstackError(f"--decode-threads must be at least 1, got {args.decode_threads}")
    return args.decode_threads


def colocated_config(args: argparse.Namespace, threads: int, prefill_threads: int):
    from services.colocated.service import ColocatedConfig
    from services.gateway.service import GatewayConfig
    from shared.engine.config import EngineConfig

    engine = engine_options(args)
    gateway = GatewayConfig(
        host=args.host,
        http_port=args.port,
        drain_timeout=args.drain_timeout,
        otlp_endpoint=args.otlp_endpoint,
        model=args.model,
        served_model_names=tuple(args.served_model_name),
        api_key=api_key(args),
        max_tokens_limit=args.max_tokens_limit,
        dtype=args.dtype,
        weights=args.weights,
        activations=args.activations,
        block_size=args.block_size,
        mock=engine["mock"],
        max_model_len=engine["max_model_len"] or 0,
        edge=edge_config(args),
    )
    return ColocatedConfig(
        gateway,
        EngineConfig(
            model=args.model,
            dtype=args.dtype,
            weights=args.weights,
            activations=args.activations,
            prefill_weights=args.prefill_weights,
            device=args.device,
            attention=args.attention,
            block_size=args.block_size,
            kv_cache_bytes=int(args.kv_cache_gib * (1 << 30)),
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_num_seqs=args.max_num_seqs,
            long_prefill_tokens=args.long_prefill_tokens,
            num_threads=threads,
            prefill_threads=prefill_threads,
            detokenize=False,  # the gateway makes the text
            enable_prefix_cache=not args.no_prefix_cache,
            fused_decode=not args.no_fused_decode,
            decode_burst=args.decode_burst,
            cuda_graphs=not args.no_cuda_graphs,
            **engine,
        ),
    )


def api_key(args: argparse.Namespace) -> str:
    """--api-key, else none with --insecure, else the key kept in --secrets-dir."""
    if args.api_key or args.insecure:
        return args.api_key
    path = ensure_api_key(Path(args.secrets_dir))
    say(f"requests need the API key in {path} (e.g. export OPENAI_API_KEY=$(cat {path}))")
    return path.read_text().strip()
