"""`python -m bench gemv`: the native GEMV (`small_linear`) against torch's F.linear by rows.

For each dtype and number of rows M, one decode step's matmuls at SmolLM2-135M's shapes (the
30 layers' qkv, o, gate_up and down; the logits head), timed both ways in the same run. The
crossover, the most rows for which the native kernel still wins, is what
`shared/model/ops.py` encodes as GEMV_MAX_ROWS for this instruction set.
"""

from __future__ import annotations

import argparse
import time

import orjson
import torch
import torch.nn.functional as F

from shared.errors import KvstackError
from shared.model.kernels import chosen_isa, cpu_ops

# (N, K) of SmolLM2-135M: qkv, o, gate_up, down of a layer (the model has 30: with distinct
# weights, 430 MB in float32, they do not stay in the caches); the tied logits head.
LAYER = ((960, 576), (576, 576), (3072, 576), (576, 1536))
HEAD = ((49152, 576),)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gemv", help="native GEMV vs torch F.linear by rows (the crossover)")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--rows", default="1,2,3,4,6,8,12,16,24,32")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--layers", type=int, default=30, help="distinct layers' weights (1: cached)")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    native = cpu_ops()
    if native is None:
        raise KvstackError("no native kernels here (KVSTACK_CPU_KERNELS=0, or no build)")
    torch.set_num_threads(args.threads)
    report: dict = {"isa": chosen_isa(), "threads": args.threads, "layers": args.layers}
    report["dtypes"] = {}
    for name in args.dtypes.split(","):
        dtype = getattr(torch, name)
        weights = {
            part: [torch.empty(n, k, dtype=dtype).normal_() for n, k in shapes]
            for part, shapes in (("layers", LAYER * args.layers), ("head", HEAD))
        }
        rows = [measure(native, weights, int(m), args.repeats) for m in args.rows.split(",")]
        del weights
        wins = [r["rows"] for r in rows if r["layers_ratio"] > 1.0]
        report["dtypes"][name] = {"by_rows": rows, "crossover": crossover(rows)}
        report["dtypes"][name]["rows_native_wins"] = wins
    print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() if args.json else table(report))
    return 0


def measure(native, weights: dict[str, list[torch.Tensor]], m: int, repeats: int) -> dict:
    """Microseconds for the layers and the head, torch and native; ratio > 1: native wins."""
    result: dict = {"rows": m}
    for part, ws in weights.items():
        inputs = [torch.randn(m, w.shape[1]).to(w.dtype) for w in ws]
        outs = [w.new_empty(m, w.shape[0]) for w in ws]

        def torch_side(ws=ws, inputs=inputs) -> None:
            for w, x in zip(ws, inputs, strict=True):
                F.linear(x, w)

        def native_side(ws=ws, inputs=inputs, outs=outs) -> None:
            for w, x, out in zip(ws, inputs, outs, strict=True):
                native.small_linear(out, x, w, None)

        torch_us, native_us = fastest((torch_side, native_side), repeats)
        result[f"{part}_torch_us"] = round(torch_us, 1)
        result[f"{part}_native_us"] = round(native_us, 1)
        result[f"{part}_ratio"] = round(torch_us / native_us, 2)
    return result


def fastest(fns, repeats: int) -> list[float]:
    """The fastest call of each function in microseconds, calls interleaved: on a shared
    machine the fastest call is the one least disturbed by other work."""
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            best[i] = min(best[i], (time.perf_counter() - start) * 1e6)
    return best


def crossover(rows: list[dict]) -> int:
    """The most rows up to which the native layers are faster at every measured M (0: never)."""
    best = 0
    for r in rows:
        if r["layers_ratio"] <= 1.0:
            break
        best = r["rows"]
    return best


def table(report: dict) -> str:
    lines = [
        (
            f"kernels {report['isa']}  threads {report['threads']}  layers {report['layers']}  "
            "(µs; ratio = torch/native)"
        )
    ]
    for name, d in report["dtypes"].items():
        lines.append(f"{name}: native wins up to {d['crossover']} rows (layers)")
        lines.append(
            f"{'rows':>6}{'layers torch':>13}{'native':>9}{'ratio':>7}"
            f"{'head torch':>12}{'native':>9}{'ratio':>7}"
        )
        for r in d["by_rows"]:
            lines.append(
                f"{r['rows']:>6}{r['layers_torch_us']:>13}{r['layers_native_us']:>9}"
                f"{r['layers_ratio']:>7}{r['head_torch_us']:>12}{r['head_native_us']:>9}"
                f"{r['head_ratio']:>7}"
            )
    return "\n".join(lines)
