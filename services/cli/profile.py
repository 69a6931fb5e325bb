"""`kvstack profile`: measure the engine over a grid and fit the cost model the conductor
uses to predict prefill and decode times (shared/costmodel/fitted.py).

With `--gateway URL` of a running stack it also measures the request overhead: what a
served request spends outside the engine before its first token.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from shared.costmodel.fitted import FittedCostModel, decode_features, fit, prefill_features
from shared.engine.config import DTYPE_CHOICES
from shared.errors import KvstackError
from shared.model.registry import DEFAULT_MODEL

if TYPE_CHECKING:  # the engine (torch) loads only when the command runs
    from shared.engine.interface import EngineInterface
    from shared.profiling import Prompts


@dataclass(frozen=True)
class Grid:
    prefill: tuple[tuple[int, int], ...]  # (new tokens, cached tokens); cached: full blocks
    decode: tuple[tuple[int, int], ...]  # (batch size, context tokens of each request)
    rounds: int = 3  # runs of each point; the median counts
    link_blocks: int = 64  # blocks of the large test transfer


def _grid(new: Iterable[int], cached: Iterable[int], extra=(), decode=()) -> Grid:
    return Grid(
        tuple((n, 0) for n in new) + tuple((n, c) for c in cached for n in extra), tuple(decode)
    )


# Lengths reach past the longest prompts served here (1.5k tokens), so predictions
# interpolate; cached prefixes are measured at a few new lengths for the n*c and c terms.
GRIDS = {
    "full": _grid(
        (16, 64, 256, 512, 1024, 1536, 2048),
        (512, 1536),
        (16, 256, 1024),
        [(b, ctx) for b in (1, 4, 8, 16, 32) for ctx in (128, 512, 1024)],
    ),
    "quick": _grid(
        (16, 128, 512, 1024, 1536),
        (1024,),
        (16, 128, 512),
        [(b, ctx) for b in (1, 4, 16, 32) for ctx in (128, 768)],
    ),
    # A random model of a few layers and a 512-token context: for tests of this command.
    "tiny": Grid(
        ((8, 0), (32, 0), (128, 0), (256, 0), (32, 128), (128, 128)),
        ((1, 32), (4, 32), (1, 128), (4, 128)),
        link_blocks=8,
    ),
}
OVERHEAD_PROMPTS = (16,) * 9  # the first one warms the stack up
DECODE_STEPS = 6  # timed steps of each decode batch


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="measure the engine and fit the conductor's cost model")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto", help="as the workers will run")
    p.add_argument("--threads", type=int, default=2, help="as the workers will run")
    p.add_argument("--out", default="", help="default: ~/.cache/kvstack/profiles/<model>.json")
    p.add_argument(
        "--quick",
        action="store_const",
        const="quick",
        dest="grid",
        default="full",
        help="a smaller grid: 1.5 minutes here, the full one 3",
    )
    p.add_argument("--grid", choices=GRIDS, default="full", help=argparse.SUPPRESS)
    p.add_argument(
        "--gateway",
        default="",
        help="URL of a running stack's gateway: also measure the request overhead around a prefill",
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get("KVSTACK_API_KEY", ""),
        help="the gateway's API key (default: $KVSTACK_API_KEY)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from shared.costmodel.overhead import check_gateway
    from shared.profiling import Prompts

    if args.gateway:
        check_gateway(args.gateway)
    grid = GRIDS[args.grid]
    engine = build_engine(args, grid)
    cost, rows = measure(engine, grid, args.threads)
    if args.gateway:  # fresh random prompts: nothing the stack may have cached
        prompts = Prompts(engine.info.model.vocab_size, seed=None)
        cost = with_overhead(cost, args.gateway, args.api_key, prompts)
    out = Path(args.out) if args.out else default_path(args.model)
    cost.save(out)
    report(cost, *rows)
    print(f"cost model for {args.model} saved to {out}")
    return 0


def default_path(model: str) -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "kvstack" / "profiles" / f"{Path(model).name}.json"


def build_engine(args: argparse.Namespace, grid: Grid) -> EngineInterface:
    from shared.engine.config import EngineConfig
    from shared.engine.engine import LLMEngine

    engine = LLMEngine(
        EngineConfig(
            model=args.model,
            dtype=args.dtype,
            num_threads=args.threads,
            max_num_batched_tokens=8192,
            max_num_seqs=256,
            num_blocks=num_blocks(grid),
        )
    )
    check_fits(grid, engine.info.max_model_len)
    return engine


def num_blocks(grid: Grid, block_size: int = 16) -> int:
    """Room for the largest decode batch or the longest prompt, whichever is more; cached
    prefixes of earlier points are evicted as needed."""
    blocks = lambda tokens: -(-tokens // block_size) + 1
    decode = max(b * blocks(ctx + DECODE_STEPS + 1) for b, ctx in grid.decode)
    prefill = max(2 * blocks(n + c) for n, c in grid.prefill)
    return max(decode, prefill, grid.link_blocks) + 64


def measure(
    engine: EngineInterface, grid: Grid, threads: int
) -> tuple[FittedCostModel, tuple[list, list]]:
    """Fit the engine's times over `grid`; also returns the measured rows."""
    from shared.profiling import EngineProbe, link_seconds

    probe = EngineProbe(engine)
    prefill = median_of_rounds(grid.prefill, "prefill", probe.prefill, grid.rounds)
    decode_step = lambda b, ctx: probe.decode_step(b, ctx, DECODE_STEPS)
    decode = [
        (b, b * ctx, s)
        for b, ctx, s in median_of_rounds(  # rows in total context
            grid.decode, "decode", decode_step, grid.rounds
        )
    ]
    storage, info = engine.kv_storage, engine.info
    link_bw, latency = link_seconds(storage, grid.link_blocks)
    cost = FittedCostModel(
        info.config.model,
        fit(prefill, prefill_features),
        fit(decode, decode_features),
        link_bw,
        latency,
        storage.token_bytes * 2 * info.model.num_layers,
        dtype=info.config.resolved_dtype,
        threads=threads,
    )
    return cost, (prefill, decode)


def check_fits(grid: Grid, max_model_len: int) -> None:
    longest = max(
        [n + c for n, c in grid.prefill] + [ctx + DECODE_STEPS + 1 for _, ctx in grid.decode]
    )
    if longest >= max_model_len:
        raise KvstackError(
            f"the profile grid needs {longest} tokens of context; the model "
            f"takes {max_model_len} (try a smaller grid)"
        )


def median_of_rounds(
    points: Sequence[tuple[int, int]], what: str, seconds: Callable[[int, int], float], rounds: int
) -> list[tuple[int, int, float]]:
    """(x, y, median seconds) per point, measured in rounds over all points: a burst of load
    elsewhere then spoils one run of several points rather than every run of one, and the
    median is the point's typical time while the machine's speed drifts."""
    runs: list[list[float]] = [[] for _ in points]
    for r in range(rounds):
        for i, (x, y) in enumerate(points):
            runs[i].append(seconds(x, y))
            print(
                f"[profile] {what} round {r + 1}/{rounds}, {i + 1}/{len(points)} {(x, y)}: "
                f"{runs[i][-1] * 1000:.1f} ms",
                file=sys.stderr,
                flush=True,
            )
    return [(x, y, statistics.median(s)) for (x, y), s in zip(points, runs)]


def with_overhead(
    cost: FittedCostModel, api_url: str, api_key: str, prompts: Prompts
) -> FittedCostModel:
    from shared.costmodel.overhead import request_overhead

    print(f"[profile] request overhead at {api_url}", file=sys.stderr, flush=True)
    samples = [prompts.fresh(n) for n in OVERHEAD_PROMPTS]
    return replace(cost, request_overhead=request_overhead(cost, api_url, samples, api_key))


def report(cost: FittedCostModel, prefill: list, decode: list) -> None:
    """The fit against every measured point, and the median and worst relative error."""
    prefill_errors = [
        report_row(f"prefill new={n:5} cached={c:5}", s, cost.prefill_time(n, c))
        for n, c, s in prefill
    ]
    decode_errors = [
        report_row(f"decode batch={b:3} context={total // b:5}", s, cost.decode_step_time(b, total))
        for b, total, s in decode
    ]
    for what, errors in (("prefill", prefill_errors), ("decode", decode_errors)):
        print(f"{what} fit: median error {statistics.median(errors):.1%}, worst {max(errors):.1%}")
    print(
        f"link: {cost.link_bw / 1e9:.2f} GB/s, {cost.link_latency * 1000:.2f} ms a transfer; "
        f"KV {cost.kv_bytes_per_token} bytes a token; measured in {cost.dtype}, "
        f"threads={cost.threads}"
    )
    print(
        f"request overhead: {cost.request_overhead * 1000:.1f} ms"
        if cost.request_overhead
        else "request overhead: not measured (pass --gateway URL of a running stack)"
    )


def report_row(label: str, measured: float, predicted: float) -> float:
    error = abs(predicted - measured) / measured
    print(
        f"{label}: measured {measured * 1000:8.1f} ms, fit {predicted * 1000:8.1f} ms "
        f"({error:5.1%})"
    )
    return error
