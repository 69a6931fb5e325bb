"""`python -m bench gemv`: the native GEMV (`small_linear`) against torch's F.linear by rows,
and the quantized layers' kernels against each other by rows.

For each dtype and number of rows M, one decode step's matmuls at SmolLM2-135M's shapes (the
30 layers' qkv, o, gate_up and down; the logits head), timed both ways in the same run. The
crossover, the most rows for which the native kernel still wins, is what
`shared/model/ops.py` encodes as GEMV_MAX_ROWS for this instruction set.

For each GGUF format (`--formats`), the same layers' matmuls through each way a QuantLinear
can multiply M rows: the in-register GEMV on float32 rows, the integer GEMV on rows rounded
to 8 bits, dequantized float32 tiles with the library GEMM, and (where the CPU has native
bfloat16) bfloat16 tiles. Where the GEMVs stop winning is what `shared/model/quant.py`
encodes as GEMV_MAX_ROWS and INT_GEMV_MAX_ROWS.
"""

from __future__ import annotations

import argparse
import time

import orjson
import torch
import torch.nn.functional as F
from torch import nn

from bench.random_model import SHAPES as MODEL_SHAPES
from shared.engine.config import cpu_has_native_bf16
from shared.errors import KvstackError
from shared.model.kernels import chosen_isa, cpu_ops
from shared.model.quant import GEMM_TILE_ROWS, QuantLinear
from shared.model.quant_formats import FORMATS, QuantFormat, quantize, random_blocks
from shared.model.weight_arena import pack_weights

Shapes = tuple[tuple[int, int], ...]


def matmul_shapes(config: dict) -> tuple[Shapes, Shapes]:
    """(N, K) of a model's qkv, o, gate_up and down, and of its tied logits head, from its
    config (bench random-model's SHAPES)."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    kv = config["num_key_value_heads"] * (hidden // config["num_attention_heads"])
    layer = ((hidden + 2 * kv, hidden), (hidden, hidden), (2 * inter, hidden), (hidden, inter))
    return layer, ((config["vocab_size"], hidden),)


# Each model's layer and head shapes (`--shapes`). SmolLM2-135M has 30 layers: with distinct
# weights, 430 MB in float32, they do not stay in the caches. Its rows are not a multiple of
# 256 values, Llama-3.2-1B's are (Q4_K's super-blocks; 34 MB a layer in Q4_K: fewer --layers).
SHAPES = {
    "smollm2-135m": matmul_shapes(MODEL_SHAPES["smollm2-135m"]),
    "llama-1b": matmul_shapes(MODEL_SHAPES["llama-3.2-1b"]),
}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gemv", help="native GEMV vs torch F.linear by rows (the crossover)")
    p.add_argument("--dtypes", default="float32,bfloat16", help="float weights ('' for none)")
    p.add_argument("--rows", default="1,2,3,4,6,8,12,16,24,32")
    p.add_argument(
        "--formats",
        default="q4_1,q8_0",
        help=f"quantized layers' kernels too, per format ({', '.join(FORMATS)}; '' for none)",
    )
    p.add_argument(
        "--prefetch",
        default="",
        help="quantized GEMVs: bytes they prefetch ahead of each weight row, one column per "
        "value, interleaved (e.g. 0,2048; default: the kernels' own)",
    )
    p.add_argument(
        "--arena",
        action="store_true",
        help="quantized GEMVs: also on a copy of the layers in one arena of huge pages, as "
        "engines keep their weights (columns ...[arena]; the others: one tensor each)",
    )
    p.add_argument("--shapes", choices=SHAPES, default="smollm2-135m", help="whose matmuls")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--layers", type=int, default=30, help="distinct layers' weights (1: cached)")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    native = cpu_ops()
    if native is None:
        raise KvstackError("no native kernels here (KVSTACK_CPU_KERNELS=0, or no build)")
    layer, head = SHAPES[args.shapes]
    formats = [check_format(name, args.shapes) for name in args.formats.split(",") if name]
    prefetch = prefetch_distances(args.prefetch)  # both checked before minutes of timing
    torch.set_num_threads(args.threads)
    report: dict = {"isa": chosen_isa(), "threads": args.threads, "layers": args.layers}
    report["shapes"] = args.shapes
    report["dtypes"] = {}
    for name in (name for name in args.dtypes.split(",") if name):
        dtype = getattr(torch, name)
        weights = {
            part: [torch.empty(n, k, dtype=dtype).normal_() for n, k in shapes]
            for part, shapes in (("layers", layer * args.layers), ("head", head))
        }
        rows = [measure(native, weights, int(m), args.repeats) for m in args.rows.split(",")]
        del weights
        wins = [r["rows"] for r in rows if r["layers_ratio"] > 1.0]
        report["dtypes"][name] = {"by_rows": rows, "crossover": crossover(rows)}
        report["dtypes"][name]["rows_native_wins"] = wins
    report["formats"] = {f.name: measure_quant(native, f, prefetch, args) for f in formats}
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
    machine the fastest call is the one least disturbed by other work.

    NOTE: each timed call follows an untimed one of the same function, so that it starts
    from the caches its own last call left, not its neighbour's: timed straight after a way
    that read the same rows, a way ran up to 1.2x faster than after one that read others (an
    unchanged kernel's column moved that much between two builds whose lists of ways
    differed: docs/notes/2026-11-29-interleaved-rows.md, "Byte dot products on interleaved
    rows")."""
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            fn()
            start = time.perf_counter()
            fn()
            best[i] = min(best[i], (time.perf_counter() - start) * 1e6)
    return best


def check_format(name: str, shapes: str) -> QuantFormat:
    if name not in FORMATS:
        raise KvstackError(f"--formats: no format {name!r}; choose from {', '.join(FORMATS)}")
    fmt = FORMATS[name]
    layer, head = SHAPES[shapes]
    widths = sorted({k for _, k in layer + head})
    if any(k % fmt.block_values for k in widths):
        raise KvstackError(
            f"--formats: {name} needs rows of a multiple of {fmt.block_values} values; "
            f"{shapes}'s are {', '.join(map(str, widths))} wide (--shapes llama-1b's are not)"
        )
    return fmt


def quant_layers(fmt: QuantFormat, num_layers: int, shapes: Shapes) -> list[QuantLinear]:
    """`num_layers` copies of one layer's four weights quantized to `fmt`: distinct memory,
    as decode reads them (quantizing every layer anew would take most of the run)."""
    first = [layer_blocks(fmt, n, k) for n, k in shapes]
    return [
        QuantLinear(blocks.clone(), fmt, k, None)
        for _ in range(num_layers)
        for blocks, (_, k) in zip(first, shapes, strict=True)
    ]


def layer_blocks(fmt: QuantFormat, n: int, k: int) -> torch.Tensor:
    """A weight [n, k] in `fmt`: a random one quantized, or (Q4_K, which the gguf package
    cannot quantize into) random blocks; the kernels' time does not depend on the values."""
    if fmt.name == "q4_k":
        return random_blocks(fmt, n, k, seed=n + k)
    return quantize(torch.randn(n, k) * 0.05, fmt)


def measure_quant(
    native, fmt: QuantFormat, prefetch: tuple[int, ...], args: argparse.Namespace
) -> dict:
    """Microseconds for one pass over the layers per way of multiplying, by rows; the fastest
    way for each M; the most rows up to which each GEMV beats the float32 tiles."""
    layers = quant_layers(fmt, args.layers, SHAPES[args.shapes][0])
    ways = {
        name: (way, layers)
        for name, way in quant_ways(native, cpu_has_native_bf16(), prefetch).items()
    }
    if layers[0].can_interleave():  # the integer GEMVs again, on the rows interleaved
        twins = interleaved(layers)
        ints = {n: w for n, (w, _) in ways.items() if n.split("@")[0] in ("gemv_q16", "gemv_q8")}
        ways |= {renamed(n, "_x8"): (w, twins) for n, w in ints.items()}
        if chosen_isa() == "avx512":  # also one group of 8 rows a vector, as AVX2 builds do
            by_256 = {n: with_setting(w, native.set_gemv_x16, False) for n, w in ints.items()}
            ways |= {renamed(n, "_x8/256"): (w, twins) for n, w in by_256.items()}
    if args.arena:  # the GEMVs again, on a copy of the layers in one arena
        packed = in_arena(layers)
        plain = (n for n in ways if n.startswith("gemv") and "_x8" not in n)
        ways |= {f"{n}[arena]": (ways[n][0], packed) for n in plain}
    by_rows = []
    for m in (int(r) for r in args.rows.split(",")):
        inputs = [torch.randn(m, layer.in_features) for layer in layers]
        sides = [lambda way=way, on=on, inputs=inputs: way(on, inputs) for way, on in ways.values()]
        times = dict(zip(ways, fastest(sides, args.repeats), strict=True))
        row = {"rows": m, **{f"{w}_us": round(t, 1) for w, t in times.items()}}
        by_rows.append({**row, "fastest": min(times, key=lambda w: times[w])})
    return {
        "by_rows": by_rows,
        "gemv_wins_up_to": wins_up_to(by_rows, "gemv_float", "tiles_float"),
        "q8_gemv_wins_up_to": wins_up_to(by_rows, "gemv_q8", "tiles_float"),
        "q16_gemv_wins_up_to": wins_up_to(by_rows, "gemv_q16", "tiles_float"),
    }


def renamed(way: str, suffix: str) -> str:
    """A way's name with `suffix` after its kind, before any prefetch distance:
    gemv_q16@2048 -> gemv_q16_x8@2048."""
    kind, at, distance = way.partition("@")
    return f"{kind}{suffix}{at}{distance}"


def with_setting(way, setter, value):
    """`way` run with one of the kernels' settings changed (`setter` returns the old value,
    put back after)."""

    def run(layers: list[QuantLinear], inputs: list[torch.Tensor]) -> None:
        old = setter(value)
        try:
            way(layers, inputs)
        finally:
            setter(old)

    return run


def interleaved(layers: list[QuantLinear]) -> list[QuantLinear]:
    """Copies of `layers` with their rows interleaved 8 at a time, as an engine keeps them
    under integer activations (shared/model/quant.py: INTERLEAVED_FORMATS)."""
    twins = copies(layers)
    for twin in twins:
        twin.interleave(True)
    return twins


def in_arena(layers: list[QuantLinear]) -> list[QuantLinear]:
    """Copies of `layers` whose blocks sit in one arena of huge pages, in order, as an engine
    keeps its weights (shared/model/weight_arena.py)."""
    packed = copies(layers)
    pack_weights(nn.ModuleList(packed))
    return packed


def copies(layers: list[QuantLinear]) -> list[QuantLinear]:
    """Layers of the same blocks in memory of their own."""
    return [
        QuantLinear(layer.blocks.clone(), layer.fmt, layer.in_features, None) for layer in layers
    ]


def prefetch_distances(text: str) -> tuple[int, ...]:
    try:
        distances = tuple(int(d) for d in text.split(",") if d)
    except ValueError:
        raise KvstackError(f"--prefetch {text!r}: give byte counts, e.g. 0,2048") from None
    if any(d < 0 for d in distances):
        raise KvstackError(f"--prefetch {text!r}: distances are 0 or more bytes")
    return distances


def quant_ways(native, bf16: bool, prefetch: tuple[int, ...] = ()) -> dict:
    """Each way a QuantLinear can multiply rows, as a call over every layer; the GEMVs once
    per prefetch distance when given (`gemv_float@0`, ...)."""

    def gemv(activations: str):
        def run(layers: list[QuantLinear], inputs: list[torch.Tensor]) -> None:
            for layer, x in zip(layers, inputs, strict=True):
                layer.activations = activations
                layer.gemv(x)

        return run

    def tiles_float(layers: list[QuantLinear], inputs: list[torch.Tensor]) -> None:
        for layer, x in zip(layers, inputs, strict=True):
            out = x.new_empty(x.shape[0], layer.out_features)
            native.quant_gemm(out, x, layer.blocks, layer.kernel_type, None, GEMM_TILE_ROWS)

    def tiles_bf16(layers: list[QuantLinear], inputs: list[torch.Tensor]) -> None:
        for layer, x in zip(layers, inputs, strict=True):
            layer.linear_bf16(x)

    gemvs = {"gemv_float": gemv("float"), "gemv_q8": gemv("q8"), "gemv_q16": gemv("q16")}
    if prefetch:
        prefetch_at = native.set_weight_prefetch
        gemvs = {
            f"{n}@{d}": with_setting(w, prefetch_at, d) for n, w in gemvs.items() for d in prefetch
        }
    ways = {**gemvs, "tiles_float": tiles_float}
    return {**ways, "tiles_bf16": tiles_bf16} if bf16 else ways


def wins_up_to(rows: list[dict], fast: str, slow: str) -> int:
    """The most rows up to which way `fast` (at its best prefetch distance) beats `slow` at
    every measured M (0: never)."""
    best = 0
    for r in rows:
        fast_us = min(
            v for k, v in r.items() if k == f"{fast}_us" or k.startswith((f"{fast}@", f"{fast}["))
        )
        if fast_us >= r[slow + "_us"]:
            break
        best = r["rows"]
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
    for name, d in report.get("formats", {}).items():
        lines += quant_table(name, d)
    return "\n".join(lines)


def quant_table(name: str, d: dict) -> list[str]:
    ways = [k.removesuffix("_us") for k in d["by_rows"][0] if k.endswith("_us")]
    width = max(16, *(len(w) + 2 for w in ways))
    lines = [
        (
            f"{name}: float32 GEMV beats float32 tiles up to {d['gemv_wins_up_to']} rows, "
            f"8-bit GEMV up to {d['q8_gemv_wins_up_to']}, 16-bit GEMV up to "
            f"{d['q16_gemv_wins_up_to']} (µs per pass over the layers)"
        ),
        f"{'rows':>6}" + "".join(f"{w:>{width}}" for w in ways) + f"{'fastest':>{width}}",
    ]
    for r in d["by_rows"]:
        cells = "".join(f"{r[w + '_us']:>{width}}" for w in ways)
        lines.append(f"{r['rows']:>6}{cells}{r['fastest']:>{width}}")
    return lines
