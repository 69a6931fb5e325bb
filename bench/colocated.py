"""`python -m bench colocated`: `kvstack serve` (one process, one engine prefilling and
decoding on every core) against `kvstack up` (nats-server, gateway, conductor, kvstore,
one prefill and one decode worker, each worker pinned to its share of the cores), both
serving --model on this machine, measured with `loadgen run` at each request rate.

Both run side by side (idle while the other is measured) and are measured interleaved:
each round runs every rate on both, the order alternating, and each run of a round sends
the same prompts to both (a seed per rate and round, so no run finds another's prefix in
a cache). Printed: TTFT and TPOT medians and output throughput of each, and their ratios.
"""

from __future__ import annotations

import argparse
import json
import re
import secrets
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.live_vs_sim.replay import run_loadgen
from services.cli.main import build_parser as kvstack_parser
from services.cli.up import stack_config
from services.stack.logs import tail
from services.stack.pinning import usable_cores
from services.stack.stack import Stack
from shared.cpu_cores import format_cores
from shared.engine.config import DTYPE_CHOICES
from shared.errors import KvstackError
from shared.model.registry import DEFAULT_MODEL, resolve_model

SHAPES = ("serve", "up")
KEPT = ("median_ttft_ms", "p90_ttft_ms", "median_tpot_ms", "output_throughput", "completed")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "colocated", help="kvstack serve against kvstack up under loadgen, interleaved"
    )
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto")
    p.add_argument("--request-rates", default="1,2", help="requests per second, comma-separated")
    p.add_argument("--num-prompts", type=int, default=20, help="per run")
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--serve-args",
        default="",
        help="more flags for kvstack serve, e.g. '--max-num-batched-tokens 512'",
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON too")
    p.set_defaults(run=run)


@dataclass(frozen=True)
class Server:
    shape: str
    url: str


def run(args: argparse.Namespace) -> int:
    rates = [float(r) for r in args.request_rates.split(",") if r.strip()]
    key = secrets.token_urlsafe(16)
    resolve_model(args.model)  # converted once, before either starts
    work = Path(tempfile.mkdtemp(prefix="bench-colocated-"))
    print(machine(), file=sys.stderr)
    with ExitStack() as running:
        servers = {
            "serve": running.enter_context(colocated(args, key, work)),
            "up": running.enter_context(disaggregated(args, key, work)),
        }
        results = measure(args, rates, servers, key, work)
    print(table(rates, results))
    if args.json:
        print(json.dumps({f"{s} {r}": v for (s, r), v in results.items()}, indent=1))
    return 0


def measure(
    args: argparse.Namespace, rates: list[float], servers: dict[str, Server], key: str, work: Path
) -> dict[tuple[str, float], list[dict]]:
    results: dict[tuple[str, float], list[dict]] = {(s, r): [] for s in SHAPES for r in rates}
    for round_ in range(args.rounds):
        for i, rate in enumerate(rates):
            seed = args.seed + round_ * len(rates) + i
            order = SHAPES if (round_ + i) % 2 == 0 else SHAPES[::-1]
            for shape in order:
                out = work / f"{shape}-{rate:g}-{round_}.json"
                argv = loadgen_argv(args, servers[shape].url, key, rate, seed, out)
                result = run_loadgen(argv, work / f"{shape}-{rate:g}-{round_}.log")
                results[shape, rate].append({k: result[k] for k in KEPT})
                print(f"{shape} at {rate:g} req/s: {summary(result)}", file=sys.stderr)
    return results


def loadgen_argv(
    args: argparse.Namespace, url: str, key: str, rate: float, seed: int, out: Path
) -> list[str]:
    return [
        "run",
        *("--base-url", url, "--api-key", key, "--model", args.model),
        *("--num-prompts", str(args.num_prompts), "--input-len", str(args.input_len)),
        *("--output-len", str(args.output_len), "--request-rate", f"{rate:g}"),
        *("--seed", str(seed), "--output-json", str(out), "--no-plots"),
    ]


@contextmanager
def colocated(args: argparse.Namespace, key: str, work: Path):
    """`kvstack serve` in a child process, on every core this one may use."""
    port, log = free_port(), work / "serve.log"
    argv = ["serve", "--port", str(port), "--api-key", key, "--dtype", args.dtype]
    argv += ["--model", args.model, *shlex.split(args.serve_args)]
    with log.open("wb") as out:
        child = subprocess.Popen(
            [sys.executable, "-m", "services.cli.main", *argv], stdout=out, stderr=out
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, child, log)
        yield Server("serve", url)
    finally:
        child.terminate()
        child.wait(timeout=60)


@contextmanager
def disaggregated(args: argparse.Namespace, key: str, work: Path):
    """The stack `kvstack up` starts with these flags (its defaults otherwise)."""
    port = free_port()
    up = kvstack_parser().parse_args(
        [
            "up",
            *("--port", str(port), "--base-port", "0", "--api-key", key),
            *("--model", args.model, "--dtype", args.dtype),
            *("--log-dir", str(work / "up-logs"), "--secrets-dir", str(work / "secrets")),
        ]
    )
    stack = Stack(stack_config(up))
    try:
        stack.start()
        stack.wait_ready()
        yield Server("up", stack.api_url)
    finally:
        stack.stop()


def wait_healthy(url: str, child: subprocess.Popen, log: Path, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise KvstackError(f"kvstack serve exited with {child.returncode}:\n{tail(log)}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise KvstackError(f"kvstack serve was not healthy within {timeout:.0f}s:\n{tail(log)}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def summary(result: dict) -> str:
    return (
        f"TTFT median {result['median_ttft_ms']:.0f} ms, TPOT median "
        f"{result['median_tpot_ms']:.1f} ms, {result['output_throughput']:.1f} tok/s, "
        f"{result['completed']} done"
    )


def table(rates: list[float], results: dict[tuple[str, float], list[dict]]) -> str:
    """A markdown row per rate: each shape's medians over the rounds, and serve / up."""
    head = (
        "| req/s | TTFT p50 serve ms | TTFT p50 up ms | up/serve | TPOT p50 serve ms | "
        "TPOT p50 up ms | up/serve | out tok/s serve | out tok/s up | serve/up |"
    )
    rows = [head, "|" + " ---: |" * 10]
    for rate in rates:
        s, u = (_median_of(results[shape, rate]) for shape in SHAPES)
        rows.append(
            f"| {rate:g} | {s['median_ttft_ms']:.0f} | {u['median_ttft_ms']:.0f} | "
            f"{_ratio(u['median_ttft_ms'], s['median_ttft_ms'])} | {s['median_tpot_ms']:.1f} | "
            f"{u['median_tpot_ms']:.1f} | {_ratio(u['median_tpot_ms'], s['median_tpot_ms'])} | "
            f"{s['output_throughput']:.1f} | {u['output_throughput']:.1f} | "
            f"{_ratio(s['output_throughput'], u['output_throughput'])} |"
        )
    return "\n".join(rows)


def _median_of(runs: list[dict]) -> dict:
    return {k: statistics.median(run[k] for run in runs) for k in KEPT}


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "-"


def machine() -> str:
    """The CPU model, its vector flags that matter here, and the cores this may use."""
    info = Path("/proc/cpuinfo").read_text()
    model = re.search(r"^model name\s*:\s*(.*)$", info, re.M)
    flags = set((re.search(r"^flags\s*:\s*(.*)$", info, re.M) or ["", ""])[1].split())
    wanted = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
    return (
        f"CPU: {model.group(1) if model else 'unknown'}; flags: "
        f"{' '.join(f for f in wanted if f in flags)}; cores {format_cores(usable_cores())}"
    )
