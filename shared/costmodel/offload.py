"""Lamina's equal-cost comparison (arXiv 2405.01814v2), estimated from the roofline: decode
throughput per dollar of attention offloading, DOP(a, b) = a H100 model workers (weights,
dense GEMMs) + b H20 attention workers (all the KV), against N H100s running the whole
model with tensor parallelism, whose HBM holds weights and KV together.

Pure functions, no I/O except `plot` and `main`. `python -m shared.costmodel.offload`
prints the table; `equal_cost_rows()` and `render_table(rows)` are what a CLI calls.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.costmodel.hardware import GB, HARDWARE, Hardware
from shared.costmodel.roofline import RooflineCostModel
from shared.costmodel.shapes import MODELS, ModelShape
from shared.errors import KvstackError

# HARDWARE's GPU profiles are nodes of 8 (`hardware.gpus`); a pool here is any count of them.
GPUS_PER_NODE = 8
# Hardware has no capacity field; per-GPU HBM from Lamina Table 1 (A800: 80 GB, as the A100
# it is cut from; the mock engine sizes its KV pool from these).
HBM_BYTES = {"a800": 80 * GB, "h100": 80 * GB, "h20": 96 * GB}
# The paper's MHA model (G = 1), where KV capacity matters most.
LLAMA_65B = ModelShape("llama-65b", 80, 8192, 22016, 64, 64, 128, 32000)
SHAPES = {**MODELS, LLAMA_65B.name: LLAMA_65B}
DEFAULT_BATCHES = (1, 8, 32, 64, 128, 256, 512, 800, 1024)
DEFAULT_CONTEXTS = (8192, 4096)
PLOT_BATCHES = tuple(sorted({round(2 ** (i / 4)) for i in range(41)}))  # 1..1024, 4 per octave
SCHEDULES = ("best", "pipelined", "serial")


@dataclass(frozen=True)
class Assumptions:
    memory_utilization: float = 0.9  # share of HBM an engine fills (vLLM's default)
    network_rtt: float = 33e-6  # per layer: FHBN's small-message RTT (NCCL: 66.6e-6)
    network_efficiency: float = 0.914  # FHBN reaches 45.7 GB/s of a 400 Gbps NIC
    # How Lamina's per-$ figures run a step: "pipelined" (two micro-batches ping-pong
    # between the pools), "serial" (one batch, nothing overlapped), or "best" (the faster of
    # the two at each batch: a deployment can choose; ping-pong reads the weights twice).
    schedule: str = "best"

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise KvstackError(f"unknown schedule {self.schedule!r}; known: {', '.join(SCHEDULES)}")


@dataclass(frozen=True)
class Pool:
    """`count` GPUs of one HARDWARE kind working as one tensor-parallel group."""

    kind: str
    count: int

    @property
    def hardware(self) -> Hardware:
        node, share = HARDWARE[self.kind], self.count / GPUS_PER_NODE
        return dataclasses.replace(
            node,
            name=f"{self.count}x{self.kind.upper()}",
            flops=node.flops * share,
            mem_bw=node.mem_bw * share,
            link_bw=node.link_bw * share,
            price_per_hour=node.price_per_hour * share,
        )

    def usable_bytes(self, assumptions: Assumptions) -> float:
        return self.count * HBM_BYTES[self.kind] * assumptions.memory_utilization


@dataclass(frozen=True)
class Scenario:
    """One equal-cost pairing: DOP(a, b) against `homogeneous` H100s, at one context."""

    shape: ModelShape
    context: int  # tokens of KV per request during decode
    model_workers: Pool = Pool("h100", 2)
    attention_workers: Pool = Pool("h20", 4)
    homogeneous: Pool = Pool("h100", 4)

    def __post_init__(self) -> None:
        # Lamina splits attention by (KV) head, so every worker gets whole KV heads.
        if self.shape.num_kv_heads % self.attention_workers.count:
            raise KvstackError(
                f"{self.attention_workers.count} attention workers cannot split "
                f"{self.shape.num_kv_heads} KV heads evenly"
            )

    @property
    def lamina_name(self) -> str:
        return f"DOP({self.model_workers.count},{self.attention_workers.count})"


@dataclass(frozen=True)
class LayerTimes:
    """Seconds one layer of a decode step keeps each resource busy for one micro-batch."""

    model: float  # dense GEMMs (QKVO projections, FFN) on the model workers
    attention: float  # reading the KV on the attention workers
    send: float  # q, k, v on the wire, model -> attention
    receive: float  # o on the wire, attention -> model
    latency: float  # fixed cost of that round trip

    @property
    def chain(self) -> float:
        """One micro-batch through the layer and back, nothing overlapped."""
        return self.model + self.send + self.attention + self.receive + self.latency


def kv_bytes_per_request(shape: ModelShape, context: int) -> int:
    return shape.kv_bytes_per_token * context


def max_batch(usable_bytes: float, weight_bytes: float, request_bytes: float) -> int:
    """Requests whose KV fits beside the weights; 0 when the weights alone do not fit."""
    return max(0, math.floor((usable_bytes - weight_bytes) / request_bytes))


def wire_bytes_per_token_per_layer(shape: ModelShape) -> tuple[int, int]:
    """(q + k + v out, o back) for one token and layer: (H + 2 H_kv) D_h e and H D_h e."""
    e, d_h = shape.bytes_per_element, shape.head_dim
    return (shape.num_heads + 2 * shape.num_kv_heads) * d_h * e, shape.num_heads * d_h * e


def homogeneous_max_batch(s: Scenario, assumptions: Assumptions) -> int:
    return max_batch(
        s.homogeneous.usable_bytes(assumptions),
        s.shape.weight_bytes,
        kv_bytes_per_request(s.shape, s.context),
    )


def lamina_max_batch(s: Scenario, assumptions: Assumptions) -> int:
    if s.shape.weight_bytes > s.model_workers.usable_bytes(assumptions):
        return 0
    return max_batch(
        s.attention_workers.usable_bytes(assumptions), 0, kv_bytes_per_request(s.shape, s.context)
    )


def homogeneous_step_time(s: Scenario, batch: int) -> float:
    cost = RooflineCostModel(s.shape, s.homogeneous.hardware)
    return cost.decode_step_time(batch, batch * s.context)


def layer_times(s: Scenario, batch: float, assumptions: Assumptions) -> LayerTimes:
    shape, model, attn = s.shape, s.model_workers.hardware, s.attention_workers.hardware
    dense = max(
        2.0 * shape.params * batch / (model.flops * model.mfu),
        shape.weight_bytes / (model.mem_bw * model.bw_efficiency),
    )
    # A batched GEMV: memory bound even on H20 (intensity ~G FLOP/B, ridge 37), but say so.
    attention = max(
        4.0
        * shape.num_layers
        * shape.num_heads
        * shape.head_dim
        * s.context
        * batch
        / (attn.flops * attn.mfu),
        shape.kv_bytes_per_token * s.context * batch / (attn.mem_bw * attn.bw_efficiency),
    )
    # Each direction is capped by the smaller pool's NICs.
    wire = min(model.link_bw, attn.link_bw) * assumptions.network_efficiency
    out, back = wire_bytes_per_token_per_layer(shape)
    return LayerTimes(
        dense / shape.num_layers,
        attention / shape.num_layers,
        out * batch / wire,
        back * batch / wire,
        assumptions.network_rtt,
    )


def lamina_step_time(s: Scenario, batch: int, assumptions: Assumptions, pipelined: bool) -> float:
    """Serial: every layer waits for its own round trip. Pipelined (ping-pong): two
    micro-batches of batch/2 alternate, so a layer takes the longer of one micro-batch's
    round trip and either resource serving both; the model reads its weights twice."""
    overhead, layers = s.model_workers.hardware.step_overhead, s.shape.num_layers
    if not pipelined:
        return overhead + layers * layer_times(s, batch, assumptions).chain
    half = layer_times(s, batch / 2, assumptions)
    busiest = 2 * max(half.model, half.attention, half.send, half.receive)
    return overhead + layers * max(half.chain, busiest)


def scenario_rows(
    s: Scenario, batches=DEFAULT_BATCHES, assumptions: Assumptions = Assumptions()
) -> list[dict]:
    """One row per batch, plus each system's largest feasible batch."""
    homo_max, lamina_max = homogeneous_max_batch(s, assumptions), lamina_max_batch(s, assumptions)
    sizes = sorted({*batches, homo_max, lamina_max} - {0})
    return [_row(s, batch, homo_max, lamina_max, assumptions) for batch in sizes]


def _row(s: Scenario, batch: int, homo_max: int, lamina_max: int, a: Assumptions) -> dict:
    homo_price = s.homogeneous.hardware.price_per_hour
    lamina_price = (
        s.model_workers.hardware.price_per_hour + s.attention_workers.hardware.price_per_hour
    )
    homo = batch / homogeneous_step_time(s, batch) if batch <= homo_max else None
    lamina = (
        {
            name: batch / lamina_step_time(s, batch, a, name == "pipelined")
            for name in ("pipelined", "serial")
        }
        if batch <= lamina_max
        else {}
    )
    chosen = max(lamina.values(), default=None) if a.schedule == "best" else lamina.get(a.schedule)
    return {
        "model": s.shape.name,
        "context": s.context,
        "batch": batch,
        "homogeneous": s.homogeneous.hardware.name,
        "lamina": s.lamina_name,
        "homogeneous_price": homo_price,
        "lamina_price": lamina_price,
        "homogeneous_feasible": homo is not None,
        "lamina_feasible": chosen is not None,
        "homogeneous_max": batch == homo_max,
        "lamina_max": batch == lamina_max,
        "homogeneous_tokens_per_s": homo,
        "homogeneous_per_dollar": homo and homo / homo_price,
        "lamina_pipelined_tokens_per_s": lamina.get("pipelined"),
        "lamina_serial_tokens_per_s": lamina.get("serial"),
        "schedule": a.schedule,
        "lamina_tokens_per_s": chosen,
        "lamina_per_dollar": chosen and chosen / lamina_price,
        "ratio": homo and chosen and (chosen / lamina_price) / (homo / homo_price),
    }


def default_scenarios(contexts=DEFAULT_CONTEXTS) -> list[Scenario]:
    return [
        Scenario(SHAPES[model], context)
        for model in ("llama3-70b", "llama-65b")
        for context in contexts
    ]


def equal_cost_rows(
    scenarios: list[Scenario] | None = None,
    batches=DEFAULT_BATCHES,
    assumptions: Assumptions = Assumptions(),
) -> list[dict]:
    """Rows of every scenario (default: LLaMA3-70B and LLaMA-65B at 8K and 4K context,
    DOP(2,4) at $40.64/hr against 4xH100 at $44.24/hr)."""
    return [
        row
        for s in scenarios or default_scenarios()
        for row in scenario_rows(s, batches, assumptions)
    ]


def summary(rows: list[dict]) -> dict:
    """Largest feasible batch and best tokens/s per $/hr of each system, for one scenario."""
    result: dict[str, Any] = {}
    for system in ("homogeneous", "lamina"):
        feasible = [r for r in rows if r[f"{system}_feasible"]]
        best = max(feasible, key=lambda r: r[f"{system}_per_dollar"], default=None)
        result[system] = {
            "max_batch": max((r["batch"] for r in feasible), default=0),
            "best_per_dollar": best and best[f"{system}_per_dollar"],
            "best_batch": best and best["batch"],
        }
    homo, lamina = result["homogeneous"], result["lamina"]
    result["best_ratio"] = (
        homo["best_per_dollar"]
        and lamina["best_per_dollar"]
        and lamina["best_per_dollar"] / homo["best_per_dollar"]
    )
    return result


def _groups(rows: list[dict]) -> list[list[dict]]:
    keys = list(dict.fromkeys((r["model"], r["context"]) for r in rows))
    return [[r for r in rows if (r["model"], r["context"]) == key] for key in keys]


def _cell(value: float | None, digits: int = 0) -> str:
    return "OOM" if value is None else f"{value:,.{digits}f}"


def render_table(rows: list[dict]) -> str:
    """Markdown: per model and context, a table over batch sizes and a summary line.
    OOM marks a batch whose KV (plus weights) does not fit that system's HBM."""
    return "\n\n".join(_render_group(group) for group in _groups(rows)) + "\n"


def _render_group(rows: list[dict]) -> str:
    first, info = rows[0], summary(rows)
    homo, lamina = first["homogeneous"], first["lamina"]
    mode = {"best": "the faster schedule", "pipelined": "2 micro-batches", "serial": "serial"}[
        first["schedule"]
    ]
    heading = (
        f"**{first['model']}, context {first['context']:,}**: {lamina} "
        f"(${first['lamina_price']:.2f}/hr) vs {homo} "
        f"(${first['homogeneous_price']:.2f}/hr); per $ and ratio use Lamina {mode}"
    )
    header = (
        f"| batch | {homo} tok/s | {homo} tok/s per $/hr | {lamina} tok/s, 2 µbatch | "
        f"{lamina} tok/s, serial | {lamina} tok/s per $/hr | ratio |"
    )
    h, m = info["homogeneous"], info["lamina"]
    footer = (
        f"Max batch: {homo} {h['max_batch']}, {lamina} {m['max_batch']}. "
        f"Best tok/s per $/hr: {homo} {_cell(h['best_per_dollar'], 1)} "
        f"(batch {h['best_batch']}), {lamina} {_cell(m['best_per_dollar'], 1)} "
        f"(batch {m['best_batch']}): {_cell(info['best_ratio'], 2)}x."
    )
    return "\n".join(
        [heading, "", header, "|" + " ---: |" * 7, *[_render_row(r) for r in rows], "", footer]
    )


def render_summary(rows: list[dict]) -> str:
    """Markdown: one line per model and context with each system's largest batch and best
    tokens/s per $/hr, and Lamina's ratios of both."""
    header = (
        "| model | context | max batch homog. | max batch Lamina | batch ratio "
        "| best tok/s per $/hr homog. | best tok/s per $/hr Lamina | per-$ ratio |"
    )
    lines = [header, "|" + " ---: |" * 8]
    for group in _groups(rows):
        info = summary(group)
        h, m = info["homogeneous"], info["lamina"]
        batch_ratio = m["max_batch"] / h["max_batch"] if h["max_batch"] else None
        cells = [
            group[0]["model"],
            f"{group[0]['context']:,}",
            str(h["max_batch"]),
            str(m["max_batch"]),
            _cell(batch_ratio, 2),
            _cell(h["best_per_dollar"], 1),
            _cell(m["best_per_dollar"], 1),
            _cell(info["best_ratio"], 2),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _render_row(r: dict) -> str:
    marks = "H" * r["homogeneous_max"] + "L" * r["lamina_max"]
    batch = f"{r['batch']:,}" + (f" ({marks} max)" if marks else "")
    ratio = "n/a" if r["ratio"] is None else f"{r['ratio']:.2f}"
    cells = [
        batch,
        _cell(r["homogeneous_tokens_per_s"]),
        _cell(r["homogeneous_per_dollar"], 1),
        _cell(r["lamina_pipelined_tokens_per_s"]),
        _cell(r["lamina_serial_tokens_per_s"]),
        _cell(r["lamina_per_dollar"], 1),
        ratio,
    ]
    return "| " + " | ".join(cells) + " |"


def plot(rows: list[dict], path: str | Path) -> Path:
    """Tokens/s per $/hr over batch size, one panel per model and context, as a PNG."""
    try:
        import matplotlib
    except ImportError:
        raise KvstackError("plots need matplotlib: pip install 'kvstack[bench]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = _groups(rows)
    columns = min(2, len(groups))
    fig, axes = plt.subplots(
        math.ceil(len(groups) / columns),
        columns,
        squeeze=False,
        figsize=(5 * columns, 3.6 * math.ceil(len(groups) / columns)),
    )
    for ax, group in zip(axes.flat, groups):
        _plot_group(ax, group)
    for ax in axes.flat[len(groups) :]:
        ax.set_visible(False)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path := Path(path), dpi=120)
    plt.close(fig)
    return path


def _plot_group(ax, rows: list[dict]) -> None:
    first = rows[0]
    lines = [
        ("homogeneous", first["homogeneous"], "homogeneous_per_dollar", "-"),
        ("lamina", f"{first['lamina']}, 2 µbatch", "lamina_pipelined_tokens_per_s", "-"),
        ("lamina", f"{first['lamina']}, serial", "lamina_serial_tokens_per_s", "--"),
    ]
    for system, label, key, style in lines:
        price = 1.0 if key.endswith("per_dollar") else first["lamina_price"]
        points = [(r["batch"], r[key] / price) for r in rows if r[f"{system}_feasible"]]
        if points:
            ax.plot(*zip(*points), style, marker="o", markersize=3, label=label)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter("{x:g}")
    ax.set_xlabel("batch (requests); curves end at the KV capacity", fontsize=8)
    ax.set_ylabel("tokens/s per $/hr", fontsize=8)
    ax.set_title(f"{first['model']}, context {first['context']:,}", fontsize=9)
    ax.grid(alpha=0.3)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m shared.costmodel.offload", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--plot", metavar="PATH", help="also write a PNG (needs matplotlib)")
    parser.add_argument(
        "--schedule",
        choices=SCHEDULES,
        default="best",
        help="how Lamina runs a step for per $ and ratio (default: best)",
    )
    parser.add_argument(
        "--summary",
        action="store_true",
        help="one line per model and context instead of the batch tables",
    )
    parser.add_argument(
        "--context",
        type=int,
        action="append",
        help="tokens of KV per request (repeatable; default 8192 and 4096)",
    )
    args = parser.parse_args(argv)
    scenarios = default_scenarios(args.context or DEFAULT_CONTEXTS)
    assumptions = Assumptions(schedule=args.schedule)
    rows = equal_cost_rows(scenarios, assumptions=assumptions)
    render = render_summary if args.summary else render_table
    print(json.dumps(rows, indent=1) if args.json else render(rows).rstrip("\n"))
    if args.plot:
        plot(equal_cost_rows(scenarios, PLOT_BATCHES, assumptions), args.plot)


if __name__ == "__main__":
    try:
        main()
    except KvstackError as error:
        raise SystemExit(f"error: {error}") from None
