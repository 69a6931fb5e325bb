"""`python -m bench decode-attention`: the native decode attention read from memory, by how
far ahead it asks for each cached slot.

A decode step attends once per layer over every sequence's cached K and V, so at a long
context or a large batch those reads outweigh the weights'. Each point here is one
`decode_attention` call per layer over SmolLM2-135M's heads (9 query, 3 kv, 64 dims), over
enough layers' caches (in huge pages, each sequence's blocks scattered over the pool as an
engine's are) that no layer is still in the caches when its turn comes back: what a step
reads. Printed per batch and context: microseconds a layer and the KV read rate, for each
prefetch distance (`--prefetch`, tokens; 0: none, the kernel before it asked; `auto`: the
kernel's default, the tokens of 6 KB of slots), measured alternately in the same run.
"""

from __future__ import annotations

import argparse
import time

import orjson
import torch

from shared import huge_pages
from shared.engine.config import EngineConfig
from shared.errors import KvstackError
from shared.kvcache.manager import cdiv
from shared.model.kernels import chosen_isa, cpu_ops

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64  # SmolLM2-135M
BLOCK = EngineConfig.block_size


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("decode-attention", help="decode attention's KV read rate by prefetch")
    p.add_argument("--dtypes", default="float32,bfloat16", help="of the KV (and the queries)")
    p.add_argument("--batch-sizes", default="1,8,32")
    p.add_argument("--contexts", default="256,1024")
    p.add_argument(
        "--prefetch",
        default="0,auto",
        help="tokens ahead, one column each ('auto': the kernel's default, 6 KB of slots)",
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--cache-mib",
        type=int,
        default=256,
        help="KV read per pass over the layers: far past the CPU's caches",
    )
    p.add_argument("--repeats", type=int, default=5, help="the fastest is reported")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    native = cpu_ops()
    if native is None:
        raise KvstackError("bench decode-attention needs the native CPU kernels")
    # every option checked before minutes of timing
    distances = prefetch_distances(args.prefetch)
    batches, contexts = (
        numbers("--batch-sizes", args.batch_sizes),
        numbers("--contexts", args.contexts),
    )
    if args.cache_mib < 1:
        raise KvstackError(f"--cache-mib {args.cache_mib}: give 1 or more")
    dtypes = [dtype_of(name) for name in args.dtypes.split(",")]
    torch.set_num_threads(args.threads)
    rows = []
    for dtype in dtypes:
        for batch in batches:
            for context in contexts:
                rows.append(
                    measure(native, dtype, batch, context, distances, args.repeats, args.cache_mib)
                )
    report = {"isa": chosen_isa(), "threads": args.threads, "rows": rows}
    print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() if args.json else table(report))
    return 0


def numbers(flag: str, text: str, least: int = 1) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise KvstackError(f"{flag} {text!r}: give whole numbers, e.g. 1,8") from None
    if any(v < least for v in values):
        raise KvstackError(f"{flag} {text!r}: numbers out of range")
    return values


def prefetch_distances(text: str) -> dict[str, int | None]:
    """--prefetch's columns by label: a number of tokens, or `auto` (None: the kernel's own)."""
    labels = text.split(",")
    given = [v for v in labels if v != "auto"]
    tokens = iter(numbers("--prefetch", ",".join(given), least=0) if given else [])
    return {v: None if v == "auto" else next(tokens) for v in labels}


def dtype_of(name: str) -> torch.dtype:
    if name not in ("float32", "bfloat16"):
        raise KvstackError(f"--dtypes: {name!r} is not float32 or bfloat16")
    return getattr(torch, name)


def measure(
    native, dtype: torch.dtype, batch: int, context: int, distances, repeats, cache_mib: int
) -> dict:
    """One point: the fastest pass over the layers for each prefetch distance, in turns."""
    blocks = batch * cdiv(context, BLOCK)
    layer_bytes = 2 * blocks * BLOCK * KV_HEADS * HEAD_DIM * dtype.itemsize
    layers = kv_layers(max(2, cache_mib * (1 << 20) // layer_bytes), blocks, dtype)
    gen = torch.Generator().manual_seed(batch * 7919 + context)
    table = torch.randperm(blocks, generator=gen).view(batch, -1)  # scattered, as a pool's
    lens = torch.full((batch,), context, dtype=torch.int64)
    q = torch.randn(batch, HEADS, HEAD_DIM, generator=gen).to(dtype)
    out = torch.empty_like(q)
    best = dict.fromkeys(distances, float("inf"))
    before = native.set_kv_prefetch(None)
    try:
        for _ in range(repeats + 1):  # the first pass warms up
            for label, distance in distances.items():
                native.set_kv_prefetch(distance)
                start = time.perf_counter()
                for k, v in layers:
                    native.decode_attention(out, q, k, v, table, lens, HEAD_DIM**-0.5)
                best[label] = min(best[label], (time.perf_counter() - start) / len(layers))
    finally:
        native.set_kv_prefetch(before)
    kv_bytes = 2 * batch * context * KV_HEADS * HEAD_DIM * dtype.itemsize
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "batch": batch,
        "context": context,
        "us": {str(d): round(t * 1e6, 1) for d, t in best.items()},
        # NOTE: three significant digits: a small point on a busy machine moves well under
        # 0.05 GB/s, which rounding to tenths made 0.0
        "gb_s": {str(d): float(f"{kv_bytes / t / 1e9:.3g}") for d, t in best.items()},
    }


def kv_layers(count: int, blocks: int, dtype: torch.dtype) -> list[tuple[torch.Tensor, ...]]:
    """`count` layers' (K, V) caches, views of one pool in huge pages as the engine's."""
    pool = huge_pages.zeros((count, 2, blocks, BLOCK, KV_HEADS, HEAD_DIM), dtype)
    pool.normal_()
    return [(layer[0], layer[1]) for layer in pool]


def table(report: dict) -> str:
    distances = list(report["rows"][0]["us"]) if report["rows"] else []
    head = f"{'dtype':>9} {'batch':>5} {'context':>7}"
    head += "".join(f" {f'us @{d}':>10} {f'GB/s @{d}':>10}" for d in distances)
    if len(distances) > 1:
        head += f" {'x':>6}"
    title = (
        f"decode attention, {report['isa']} build, {report['threads']} threads: microseconds a "
        "layer and KV read GB/s, by tokens prefetched ahead (0: none; auto: the kernel's default)"
    )
    lines = [title, head]
    for r in report["rows"]:
        line = f"{r['dtype']:>9} {r['batch']:>5} {r['context']:>7}"
        line += "".join(f" {r['us'][d]:>10} {r['gb_s'][d]:>10}" for d in distances)
        if len(distances) > 1:
            line += f" {r['us'][distances[0]] / r['us'][distances[-1]]:>6.2f}"
        lines.append(line)
    if len(distances) > 1:
        lines.append(f"(x: time at {distances[0]} over time at {distances[-1]})")
    return "\n".join(lines)
