"""`python -m bench offload`: decode tokens/s with attention local vs offloaded to attention
workers (separate processes, over the attention link), the share of the link's round trips
the micro-batch pipeline hides, bytes per token per layer against Lamina's formula, and the
cost model's equal-cost comparison (throughput per dollar) beside them."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import orjson
import torch

from bench.engine import KvstackSide, device_name
from services.decode.attention_group import AttentionGroup
from services.decode.offload_runner import OffloadRunner
from services.stack.stack import Stack, StackConfig
from shared.costmodel import offload as lamina
from shared.engine.config import DTYPE_CHOICES, EngineConfig
from shared.engine.device import resolve_device
from shared.engine.engine import LLMEngine
from shared.model.config import ModelConfig
from shared.model.registry import DEFAULT_MODEL, resolve_model


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("offload", help="decode tokens/s, attention local vs offloaded (Lamina)")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="float32")
    p.add_argument(
        "--device",
        default="cpu",
        help="the decode engine's device (cpu, cuda, cuda:N); attention workers run on the CPU",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads of the decode process and of each attention worker",
    )
    p.add_argument(
        "--groups",
        default="",
        help="attention-worker counts, comma-separated "
        "(default: those up to 3 that divide the model's KV heads)",
    )
    p.add_argument("--micro-batches", default="1,2", help="pipeline depths to compare")
    p.add_argument("--batch-sizes", default="1,8,32")
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--decode-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    config = EngineConfig(
        model=args.model,
        device=resolve_device(args.device),
        dtype=args.dtype,
        num_threads=args.threads,
        enable_prefix_cache=False,
        max_num_batched_tokens=8192,
        max_num_seqs=256,
        kv_cache_bytes=512 << 20,
    )
    local = LLMEngine(config)
    mc = local.info.model
    groups = (
        [int(g) for g in args.groups.split(",")]
        if args.groups
        else [g for g in (1, 2, 3) if mc.num_kv_heads % g == 0]
    )
    batches = [int(b) for b in args.batch_sizes.split(",")]
    rows = [measure(args, local, batch, "local", 0, 0) for batch in batches]
    del local
    with attention_workers(max(groups), args) as stack:
        for size in groups:
            for depth in (int(m) for m in args.micro_batches.split(",")):
                engine, group = offloaded(stack, config, size, depth)
                rows += [
                    measure(args, engine, batch, "offload", size, depth, group) for batch in batches
                ]
                group.close()
    report = {
        "model": args.model,
        "dtype": config.resolved_dtype,
        "device": device_name(args),
        "threads": args.threads,
        "thread_budget": f"decode process {args.threads} torch thread(s); each attention "
        f"worker process {args.threads}",
        "cpus": _cpus(),
        "formula_bytes": formula(mc, config),
        "rows": rows,
        "equal_cost": lamina.equal_cost_rows(),
    }
    print(
        orjson.dumps(report, option=orjson.OPT_INDENT_2).decode()
        if args.json
        else format_report(report)
    )
    return 0


def measure(
    args,
    engine: LLMEngine,
    batch: int,
    mode: str,
    group_size: int,
    depth: int,
    group: AttentionGroup | None = None,
) -> dict:
    progress(f"{mode} group {group_size} micro-batches {depth}: batch {batch}")
    side = KvstackSide(engine)
    rate = side.decode_rate(batch, args.prompt_len, args.decode_tokens, args.repeats)
    row = {
        "mode": mode,
        "attention_workers": group_size,
        "micro_batches": depth,
        "batch": batch,
        "tok_s": round(rate, 1),
    }
    if group is None:
        return row
    group.blocked_seconds = group.roundtrip_seconds = 0.0
    side.decode_rate(batch, args.prompt_len, args.decode_tokens, 1)
    row["hidden_share"] = round(group.hidden_share, 3)
    return row | wire_bytes(side, group, batch, args.prompt_len, engine.info.model.num_layers)


def wire_bytes(
    side: KvstackSide, group: AttentionGroup, batch: int, prompt_len: int, num_layers: int
) -> dict:
    """Bytes per token per layer of one prefill + one decode step, from the link counters."""
    before = group.counter("qkv_bytes"), group.counter("out_bytes")
    side.decode_time(batch, prompt_len, 2)
    num_tokens = batch * (prompt_len + 1) * num_layers
    return {
        "sent_per_token_layer": (group.counter("qkv_bytes") - before[0]) / num_tokens,
        "received_per_token_layer": (group.counter("out_bytes") - before[1]) / num_tokens,
    }


def formula(mc, config: EngineConfig) -> dict:
    e = torch.empty((), dtype=getattr(torch, config.resolved_dtype)).element_size()
    return {
        "send": (mc.num_heads + 2 * mc.num_kv_heads) * mc.head_dim * e,
        "receive": mc.num_heads * mc.head_dim * e,
    }


@contextmanager
def attention_workers(count: int, args: argparse.Namespace):
    """nats-server and `count` attention-worker processes."""
    log_dir = Path(tempfile.mkdtemp(prefix="kvstack-bench-offload-"))
    stack = Stack(
        StackConfig(
            num_prefill=0, num_decode=0, with_conductor=False, with_gateway=False, log_dir=log_dir
        )
    )
    try:
        stack.start()
        for i in range(count):
            stack.spawn(
                f"attention-{i}",
                [
                    "attention-worker",
                    "--worker-id",
                    f"attention-{i}",
                    "--threads",
                    str(args.threads),
                    "--kv-cache-gib",
                    "1",
                ],
            )
        stack.wait_ready()
        yield stack
    finally:
        stack.stop()


def offloaded(
    stack: Stack, config: EngineConfig, size: int, depth: int
) -> tuple[LLMEngine, AttentionGroup]:
    model = ModelConfig.from_dir(resolve_model(config.model))
    ids = [f"attention-{i}" for i in range(size)]

    async def attach() -> tuple[AttentionGroup, int]:
        bus = await stack.bus("bench-offload")
        group = AttentionGroup(
            bus,
            "bench-offload",
            ids,
            model,
            config.resolved_dtype,
            config.block_size,
            stack.data_token,  # the attention workers' data-plane secret
            30.0,
        )
        try:
            return group, await group.attach()
        finally:
            await bus.drain()

    group, num_blocks = asyncio.run(attach())
    engine = LLMEngine(dataclasses.replace(config, num_blocks=num_blocks, local_kv=False))
    engine.use_runner(lambda runner: OffloadRunner(runner.model, runner.storage, group, depth))
    return engine, group


def progress(message: str) -> None:
    print(f"[bench offload] {message}", file=sys.stderr, flush=True)


def _cpus() -> int:
    return len(os.sched_getaffinity(0))


def format_report(report: dict) -> str:
    f = report["formula_bytes"]
    lines = [
        (
            f"model {report['model']} ({report['dtype']}, decode on {report['device']}); "
            f"{report['thread_budget']}; "
            f"{report['cpus']} CPUs"
        ),
        f"formula: send {f['send']} B, receive {f['receive']} B per token per layer",
        (
            f"{'mode':8}{'workers':>8}{'micro':>6}{'batch':>6}{'tok/s':>9}{'vs local':>9}"
            f"{'hidden':>8}{'sent B':>9}{'recv B':>9}"
        ),
    ]
    local = {r["batch"]: r["tok_s"] for r in report["rows"] if r["mode"] == "local"}
    for r in report["rows"]:
        extra = (
            ""
            if r["mode"] == "local"
            else (
                f"{r['hidden_share']:>8.0%}{r['sent_per_token_layer']:>9.0f}"
                f"{r['received_per_token_layer']:>9.0f}"
            )
        )
        lines.append(
            f"{r['mode']:8}{r['attention_workers']:>8}{r['micro_batches']:>6}"
            f"{r['batch']:>6}{r['tok_s']:>9}{r['tok_s'] / local[r['batch']]:>9.2f}{extra}"
        )
    lines += [
        "",
        "Lamina equal-cost estimate (cost model):",
        lamina.render_table(report["equal_cost"]),
        "",
        lamina.render_summary(report["equal_cost"]),
    ]
    return "\n".join(lines)
