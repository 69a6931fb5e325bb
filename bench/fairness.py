"""`python -m bench fairness`: the time to first token of a short prompt that arrives while a
long one prefills, with fair prefill off (the long prompt holds each step's budget: the
baseline) and on (`long_prefill_tokens`), beside the short prompt alone.

The engine runs in its own thread (`EngineLoop`, as in the workers), so the short prompt
arrives in wall time, in the middle of the long one's first step.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from dataclasses import dataclass, field

import orjson
import torch

from bench.engine import random_prompt
from shared.engine.config import DTYPE_CHOICES, EngineConfig, resolve_dtype
from shared.engine.engine import LLMEngine
from shared.engine.interface import EngineInterface
from shared.engine.loop import EngineLoop
from shared.engine.output import RequestOutput
from shared.errors import KvstackError
from shared.model.registry import DEFAULT_MODEL
from shared.sampling_params import SamplingParams

FIRST_TOKEN = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fairness", help="TTFT of a short prompt behind a long one, fair prefill off vs on"
    )
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--long-tokens", type=int, default=8000, help="the long prompt's length")
    p.add_argument("--short-tokens", type=int, default=32, help="the short prompt's length")
    p.add_argument(
        "--delay",
        type=float,
        default=0.1,
        help="seconds after the long prompt's first step starts that the short one arrives",
    )
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument(
        "--long-prefill-tokens",
        type=int,
        default=None,
        help="the fair policy's chunk cap (default: the engine's)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


@dataclass
class StepClock:
    """Wraps the engine's step on its thread: times each step and notes when each
    request's first token came out."""

    durations: list[float] = field(default_factory=list)
    submitted: dict[str, tuple[float, int]] = field(default_factory=dict)  # time, steps done
    first_token: dict[str, tuple[float, int]] = field(default_factory=dict)
    stepping: bool = False

    def ttft(self, request_id: str) -> float:
        return round(self.first_token[request_id][0] - self.submitted[request_id][0], 3)

    def steps_waited(self, request_id: str) -> int:
        """Steps that ended between its arrival and its first token, that one included:
        unlike seconds, the same on a busy machine."""
        return self.first_token[request_id][1] - self.submitted[request_id][1]

    def __call__(self, engine: EngineInterface) -> list[RequestOutput]:
        self.stepping = True
        started = time.perf_counter()
        outputs = engine.step()
        ended = time.perf_counter()
        self.durations.append(ended - started)
        for out in outputs:
            if out.new_token_ids:
                self.first_token.setdefault(out.request_id, (ended, len(self.durations)))
        return outputs


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    runs = [
        measure(args, "fair prefill off", 0, with_long=True),
        measure(args, "fair prefill on", args.long_prefill_tokens, with_long=True),
        measure(args, "short prompt alone", args.long_prefill_tokens, with_long=False),
    ]
    report = {
        "model": args.model,
        "dtype": resolve_dtype(args.dtype),
        "threads": args.threads,
        "long_tokens": args.long_tokens,
        "short_tokens": args.short_tokens,
        "delay_s": args.delay,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "runs": runs,
    }
    print(
        orjson.dumps(report, option=orjson.OPT_INDENT_2).decode()
        if args.json
        else format_table(report)
    )
    return 0


def measure(
    args: argparse.Namespace, policy: str, long_prefill_tokens: int | None, with_long: bool
) -> dict:
    progress(f"{policy}: loading the engine")
    engine = LLMEngine(
        EngineConfig(
            model=args.model,
            dtype=args.dtype,
            num_threads=args.threads,
            enable_prefix_cache=False,
            max_num_batched_tokens=args.max_num_batched_tokens,
            long_prefill_tokens=long_prefill_tokens,
        )
    )
    if args.long_tokens >= engine.info.max_model_len:
        raise KvstackError(
            f"--long-tokens must be below the context limit "
            f"{engine.info.max_model_len}, got {args.long_tokens}"
        )
    warm_up(engine, args)
    progress(f"{policy}: measuring")
    clock = asyncio.run(race(engine, args, with_long))
    result = {
        "policy": policy,
        "long_prefill_tokens": engine.info.prefill_chunk_cap,
        "long_ttft_s": clock.ttft("long") if with_long else None,
        "short_ttft_s": clock.ttft("short"),
        "short_steps_waited": clock.steps_waited("short"),
        "steps": len(clock.durations),
        "mean_step_s": round(statistics.mean(clock.durations), 3),
    }
    progress(f"{policy}: {result}")
    return result


def warm_up(engine: LLMEngine, args: argparse.Namespace) -> None:
    """One full-budget step and one short prompt, so no first-use cost lands in the race."""
    vocab = engine.info.model.vocab_size
    prompts = [
        random_prompt(args.max_num_batched_tokens, vocab, 1),
        random_prompt(args.short_tokens, vocab, 2),
    ]
    engine.generate(prompts, FIRST_TOKEN)


async def race(engine: LLMEngine, args: argparse.Namespace, with_long: bool) -> StepClock:
    """Submit the long prompt, then the short one `delay` seconds into the long one's first
    step (or the short one alone); return when each has its first token."""
    clock = StepClock()
    engine_loop = EngineLoop(engine, asyncio.get_running_loop(), lambda outputs: None, step=clock)
    engine_loop.start()
    vocab = engine.info.model.vocab_size
    wanted = ["short"]
    if with_long:
        wanted.append("long")
        await submit(engine_loop, clock, "long", random_prompt(args.long_tokens, vocab, 3))
        while not clock.stepping:
            await asyncio.sleep(0.001)
        await asyncio.sleep(args.delay)
    await submit(engine_loop, clock, "short", random_prompt(args.short_tokens, vocab, 4))
    while not all(rid in clock.first_token for rid in wanted):
        await asyncio.sleep(0.01)
    engine_loop.stop()
    return clock


async def submit(
    engine_loop: EngineLoop, clock: StepClock, request_id: str, prompt: list[int]
) -> None:
    # NOTE: the engine takes it between steps: its TTFT includes the rest of a running step.
    clock.submitted[request_id] = (time.perf_counter(), len(clock.durations))
    await engine_loop.call(lambda e: e.add_request(request_id, prompt, FIRST_TOKEN))


def progress(message: str) -> None:
    print(f"[bench fairness] {message}", file=sys.stderr, flush=True)


def format_table(report: dict) -> str:
    lines = [
        (
            f"model {report['model']} ({report['dtype']}), threads {report['threads']}; long "
            f"prompt {report['long_tokens']} tokens, short {report['short_tokens']} tokens "
            f"arriving {report['delay_s']}s into its first step; budget "
            f"{report['max_num_batched_tokens']} tokens per step"
        ),
        (
            f"{'policy':22}{'cap':>6}{'long TTFT s':>13}{'short TTFT s':>14}"
            f"{'short steps':>13}{'steps':>7}{'mean step s':>13}"
        ),
    ]
    for r in report["runs"]:
        long_ttft = "-" if r["long_ttft_s"] is None else r["long_ttft_s"]
        lines.append(
            f"{r['policy']:22}{r['long_prefill_tokens']:>6}{long_ttft:>13}"
            f"{r['short_ttft_s']:>14}{r['short_steps_waited']:>13}"
            f"{r['steps']:>7}{r['mean_step_s']:>13}"
        )
    return "\n".join(lines)
