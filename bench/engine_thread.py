"""`python -m bench engine-thread`: one engine's prefill and decode tokens/s by the threads it
is built and stepped on, each placement in a fresh process (libgomp's teams live as long as
their threads, so placements cannot share one), rounds interleaved, medians printed:

- `main`: built and stepped on the process's first thread (a script, `kvstack generate`);
- `split`: built on an executor's thread, which lives on, and stepped on another (the
  services before `shared/engine/engine_thread.py`);
- `engine-thread`: built and stepped on one `EngineThread` (the services now).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import statistics
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from bench.engine import KvstackSide
from shared.engine.config import DTYPE_CHOICES, EngineConfig
from shared.engine.engine import LLMEngine
from shared.engine.engine_thread import EngineThread
from shared.model.registry import DEFAULT_MODEL

PLACEMENTS = ("main", "split", "engine-thread")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "engine-thread", help="engine speed by the threads it is built and stepped on"
    )
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto")
    p.add_argument("--threads", type=int, default=2, help="the engine's torch threads")
    p.add_argument("--prefill-lens", default="128,512")
    p.add_argument("--decode-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--child", choices=PLACEMENTS, help=argparse.SUPPRESS)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.child:
        print(json.dumps(measure_here(args, args.child)))
        return 0
    rounds: dict[str, list[dict]] = {p: [] for p in PLACEMENTS}
    for r in range(args.rounds):
        order = PLACEMENTS if r % 2 == 0 else PLACEMENTS[::-1]
        for placement in order:
            print(f"[bench engine-thread] round {r + 1}: {placement}", file=sys.stderr)
            rounds[placement].append(measure_in_child(args, placement))
    print(format_table(args, {p: medians(rs) for p, rs in rounds.items()}))
    return 0


def measure_in_child(args: argparse.Namespace, placement: str) -> dict[str, float]:
    argv = [sys.executable, "-m", "bench", "engine-thread", "--child", placement]
    for flag in ("model", "dtype", "threads", "prefill_lens", "decode_tokens", "repeats"):
        argv += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{placement}: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_here(args: argparse.Namespace, placement: str) -> dict[str, float]:
    config = EngineConfig(
        model=args.model,
        dtype=args.dtype,
        num_threads=args.threads,
        enable_prefix_cache=False,
        max_num_batched_tokens=8192,
    )
    build, step = placed(placement)
    side = KvstackSide(build(lambda: LLMEngine(config)))
    rates = {
        f"prefill {n}": step(lambda n=n: side.prefill_rate(n, args.repeats))
        for n in (int(n) for n in args.prefill_lens.split(","))
    }
    rates["decode batch 1"] = step(
        lambda: side.decode_rate(1, 64, args.decode_tokens, args.repeats)
    )
    return rates


def placed(placement: str) -> tuple[Callable[[Callable[[], Any]], Any], Callable[..., Any]]:
    """(build, step): each runs a function where `placement` builds or steps the engine."""
    here = lambda fn: fn()
    if placement == "main":
        return here, here
    engine_thread = EngineThread()
    on_engine_thread = lambda fn: engine_thread.submit(fn).result()
    if placement == "engine-thread":
        return on_engine_thread, on_engine_thread
    loader = concurrent.futures.ThreadPoolExecutor(1)  # NOTE: kept alive, as the loop's was
    return (lambda fn: loader.submit(fn).result()), on_engine_thread


def medians(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}


def format_table(args: argparse.Namespace, results: dict[str, dict[str, float]]) -> str:
    keys = list(results["main"])
    lines = [
        (
            f"model {args.model} ({args.dtype}), {args.threads} torch threads, "
            f"medians of {args.rounds} interleaved rounds, tokens/s"
        ),
        f"{'':18}" + "".join(f"{p:>15}" for p in PLACEMENTS) + f"{'x split':>10}",
    ]
    for key in keys:
        row = [results[p][key] for p in PLACEMENTS]
        lines.append(
            f"{key:18}" + "".join(f"{v:>15.1f}" for v in row) + f"{row[2] / row[1]:>10.2f}"
        )
    lines.append("x split: engine-thread / split (the services now / before)")
    return "\n".join(lines)
