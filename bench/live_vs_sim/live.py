"""One policy replayed live: `kvstack up --engine mock ...` (its own flags and stack, started
in this process as bench chaos starts one), `loadgen run --trace` against it, then the
conductor's estimate errors over NATS and the TTFT of single requests on the idle stack."""

from __future__ import annotations

import asyncio
import random
import socket
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson

from bench.live_vs_sim.replay import Replay, Summary, run_loadgen
from services.cli import up
from services.cli.main import build_parser
from services.stack.stack import Stack
from shared import subjects
from shared.errors import KvstackError
from shared.messages import ConductorStats, EstimateError, StatsRequest
from shared.model.registry import resolve_model

SETTLE_SECONDS = 5.0  # idle after ready, so every worker has beaten a few times
PROBE_TOKENS = (512, 8192)  # prompt lengths of the single requests on the idle stack
PROBES_EACH = 2


@dataclass(frozen=True)
class LiveRun:
    summary: Summary
    idle_ttft: dict[int, float]  # prompt tokens -> mean TTFT of single requests, seconds


def up_argv(replay: Replay, policy: str, port: int, log_dir: Path) -> list[str]:
    """`kvstack up`'s command line for this replay (insecure: loopback only)."""
    return [
        "up",
        *("--engine", "mock", "--mock-model", replay.model, "--mock-hardware", replay.hardware),
        *("--prefill", str(replay.prefill), "--decode", str(replay.decode)),
        *("--kvstore", str(replay.kvstore), "--policy", policy, "--admission", replay.admission),
        *("--insecure", "--port", str(port), "--log-dir", str(log_dir)),
        *("--base-port", "0"),  # every other service on a free port, beside other stacks
    ]


def run_live(replay: Replay, policy: str, work_dir: Path, say: Callable[[str], None]) -> LiveRun:
    argv = up_argv(replay, policy, _free_port(), work_dir / f"logs-{policy}")
    say(f"{policy}: kvstack {' '.join(argv)}")
    args = build_parser().parse_args(argv)
    resolve_model(args.model)  # the tokenizer, once here (as `kvstack up` does)
    stack = Stack(up.stack_config(args))
    try:
        stack.start()
        stack.wait_ready()
        time.sleep(SETTLE_SECONDS)
        say(f"{policy}: up; replaying {replay.max_requests} requests live")
        result = run_loadgen(_run_argv(replay, policy, stack, work_dir), work_dir / "loadgen.log")
        estimates = asyncio.run(_estimates(stack))
        say(f"{policy}: single requests on the idle stack")
        idle = {n: idle_ttft(stack.api_url, args.model, n) for n in PROBE_TOKENS}
    finally:
        say(f"{policy}: stopping the stack")
        stack.stop()
    return LiveRun(Summary.of(result, estimates), idle)


def _run_argv(replay: Replay, policy: str, stack: Stack, work_dir: Path) -> list[str]:
    return [
        "run",
        *("--base-url", stack.api_url, "--dataset", "mooncake-trace", *replay.slice_args()),
        *("--label", f"live-{policy}", "--no-plots"),
        *("--output-json", str(work_dir / f"live-{policy}.json")),
    ]


async def _estimates(stack: Stack) -> dict[str, dict[str, float]]:
    """The live conductor's own estimate errors (ConductorStats.estimates)."""
    bus = await stack.bus("bench-live-vs-sim")
    try:
        stats = await bus.request(
            subjects.conductor_stats(), StatsRequest(), 5.0, expected=ConductorStats
        )
    finally:
        await bus.drain()
    return {e.estimate: _fields(e) for e in stats.estimates}


def _fields(error: EstimateError) -> dict[str, float]:
    return {k: v for k, v in asdict(error).items() if k != "estimate"}


def idle_ttft(api_url: str, model: str, num_tokens: int) -> float:
    """Mean TTFT of PROBES_EACH single requests of fresh random tokens, one at a time."""
    rng = random.Random(num_tokens)
    times = []
    for _ in range(PROBES_EACH):
        prompt = [rng.randrange(1000, 32000) for _ in range(num_tokens)]
        times.append(first_token_seconds(api_url, model, prompt))
    return sum(times) / len(times)


def first_token_seconds(api_url: str, model: str, prompt: list[int]) -> float:
    """Seconds from sending a streaming completion to its first token event."""
    body = {"model": model, "prompt": prompt, "max_tokens": 2, "stream": True}
    body |= {"temperature": 0, "ignore_eos": True}
    request = urllib.request.Request(
        f"{api_url}/v1/completions", orjson.dumps(body), {"Content-Type": "application/json"}
    )
    began = time.perf_counter()
    with urllib.request.urlopen(request, timeout=300) as response:
        for line in response:
            if line.startswith(b"data: {") and _has_text(line[6:]):
                first = time.perf_counter() - began
                response.read()  # the rest of the stream
                return first
    raise KvstackError("the stream ended with no token")


def _has_text(data: bytes) -> bool:
    return any(c.get("text") for c in orjson.loads(data).get("choices") or ())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
