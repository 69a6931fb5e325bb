"""`python -m bench step-phases`: where a decode step's wall time goes, phase by phase.

The engine decodes a batch in this process with a timer around each phase of its step
(the scheduler, the step's metadata, the fused step's one native call (embeddings, layers,
final norm and, for a quantized head, the logits), sampling, appending the token...); what
no timer covers is the step's own Python. The native call's own timers split it into its
parts (DecodeStack.time_parts: each layer's GEMVs, attention, norms; the head), summed over
the layers. Unlike `bench decode-profile` it needs no sampler and does not slow the step
down: the timers cost a microsecond or so each (the native ones ~20 ns). Printed:
microseconds per step and share of each phase and part, and tokens/s.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import orjson

from bench.decode_profile import add_engine_arguments, warm_side
from shared.engine.engine import LLMEngine
from shared.errors import KvstackError

NATIVE = ("native step", "logits head")  # phases that are one native call, or nearly


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("step-phases", help="microseconds per decode step, phase by phase")
    add_engine_arguments(p)
    p.add_argument("--rounds", type=int, default=5, help="the median round is reported")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


class Timers:
    """Seconds spent in each phase since the last reset, and the native step's own timers of
    its parts (DecodeStack.time_parts: the GEMVs, attention, norms, the head...)."""

    def __init__(self) -> None:
        self.spent: collections.defaultdict[str, float] = collections.defaultdict(float)
        self.stack: Any = None  # the fused step's native stack, once instrumented

    def reset(self) -> None:
        self.spent.clear()
        if self.stack is not None:
            self.stack.time_parts(True)

    def parts(self) -> dict[str, float]:
        """Microseconds a native step spent in each part since the reset (the parts it ran)."""
        if self.stack is None:
            return {}
        times = dict(self.stack.part_times())
        steps = times.pop("steps")
        return {part: us / steps for part, us in times.items() if steps and us > 0}

    def wrap(self, owner: Any, name: str, phase: str) -> None:
        """Time every call of `owner.name` (a bound method or a callable attribute)."""
        object.__setattr__(owner, name, timed(getattr(owner, name), self.spent, phase))


def timed(call: Callable, spent: dict[str, float], key: str) -> Callable:
    """`call`, adding the seconds each call takes to spent[key]."""

    def timed_call(*args, **kwargs):
        start = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            spent[key] += time.perf_counter() - start

    return timed_call


class TimedStack:
    """The fused decode's native stack (a pybind object: its methods cannot be replaced)
    behind a timer."""

    def __init__(self, stack: Any, timers: Timers) -> None:
        self.stack, self.timers = stack, timers

    def step(self, *args):
        start = time.perf_counter()
        try:
            return self.stack.step(*args)
        finally:
            self.timers.spent["native step"] += time.perf_counter() - start

    def __getattr__(self, name: str):
        return getattr(self.stack, name)


def instrument(engine: LLMEngine) -> Timers:
    timers = Timers()
    runner = engine._runner
    fused = getattr(runner, "fused", None)  # a mock engine's runner has none
    if fused is None:
        raise KvstackError("step-phases times the fused decode step: this engine has none")
    timers.wrap(engine._scheduler, "schedule", "scheduler")
    timers.wrap(runner, "prepare", "metadata")
    timers.wrap(runner, "_fused_route", "route")
    timers.wrap(fused.model.rotary, "tables", "rotary tables")
    timers.stack = fused.stack
    fused.stack = TimedStack(fused.stack, timers)
    timers.wrap(runner, "_logits", "logits head")  # where the native step leaves it
    timers.wrap(runner, "sample", "sampling")
    timers.wrap(engine, "_append", "append token")
    return timers


def run(args: argparse.Namespace) -> int:
    side = warm_side(args)
    timers = instrument(side.engine)
    rounds = []
    try:
        for _ in range(args.rounds):
            timers.reset()
            seconds = side.decode_time(args.batch, args.prompt_len, args.decode_tokens)
            rounds.append((seconds, dict(timers.spent), timers.parts()))
    finally:
        timers.stack.time_parts(False)
    report = summary(args, rounds)
    print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() if args.json else table(report))
    return 0


def summary(
    args: argparse.Namespace, rounds: list[tuple[float, dict[str, float], dict[str, float]]]
) -> dict:
    """The median round (by its time) in microseconds per step."""
    seconds, spent, parts = sorted(rounds, key=lambda r: r[0])[len(rounds) // 2]
    steps = args.decode_tokens - 1  # the first token is the prompt's
    per_step = {phase: round(s / steps * 1e6, 1) for phase, s in spent.items()}
    step_us = seconds / steps * 1e6
    per_step["the step's own Python"] = round(step_us - sum(per_step.values()), 1)
    return {
        "batch": args.batch,
        "threads": args.threads,
        "prompt_len": args.prompt_len,
        "decode_tok_s": round(args.batch / (step_us / 1e6), 1),
        "step_us": round(step_us, 1),
        "spread_tok_s": [round(args.batch * steps / s) for s, _, _ in rounds],
        "median_tok_s": round(statistics.median(args.batch * steps / s for s, _, _ in rounds), 1),
        "phases_us": dict(sorted(per_step.items(), key=lambda kv: -kv[1])),
        "native_parts_us": {part: round(us, 1) for part, us in parts.items()},
    }


def table(report: dict) -> str:
    step = report["step_us"]
    native = sum(report["phases_us"].get(phase, 0.0) for phase in NATIVE)
    head = (
        f"decode batch {report['batch']}  threads {report['threads']}  prompt "
        f"{report['prompt_len']}: {report['decode_tok_s']} tok/s, {step:.0f} us a step "
        f"(rounds: {report['spread_tok_s']} tok/s)"
    )
    outside = (
        f"outside the native step (and a head it leaves to compute_logits): "
        f"{step - native:.0f} us ({100 * (step - native) / step:.1f}%; a head's phase includes "
        "its Python)"
    )
    lines = [head]
    for phase, us in report["phases_us"].items():
        lines.append(f"  {us:8.1f} us  {100 * us / step:5.1f}%  {phase}")
        if phase == "native step":
            lines.extend(
                f"    {part_us:8.1f} us  {100 * part_us / step:5.1f}%    {part}"
                for part, part_us in report["native_parts_us"].items()
            )
    lines.append(outside)
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit("run as: python -m bench step-phases")
