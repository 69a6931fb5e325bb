"""`python -m bench chaos`: start a supervised kvstack, put a steady load of streaming greedy
requests on it, kill each kind of process in turn (and restart nats-server), and print
what became of every request. Exit code 1 when a request was lost or hung, or KV leaked."""

from __future__ import annotations

import argparse
import json
import socket
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from bench.chaos.faults import FAULTS
from bench.chaos.load import Case
from bench.chaos.runner import ChaosConfig, ChaosReport, run_chaos
from services.stack.restarts import RestartPolicy
from services.stack.stack import Stack, StackConfig
from shared.errors import KvstackError

TOPICS = ("the sea", "a cat", "winter", "bread", "a river", "the moon", "music", "trees")
# float32 everywhere, so each answer can be compared with the reference engine's exactly
WORKER_ARGS = ("--dtype", "float32", "--threads", "1", "--kv-cache-gib", "0.25")


def add_parser(sub: argparse._SubParsersAction) -> None:
    defaults = ChaosConfig()
    p = sub.add_parser(
        "chaos",
        help="kill each kvstack service in turn under load; count "
        "completed, migrated, errored, lost and hung requests",
        description=__doc__,
    )
    p.add_argument("--prefill", type=int, default=2)
    p.add_argument("--decode", type=int, default=2)
    p.add_argument("--kvstore", type=int, default=1)
    p.add_argument(
        "--attention-workers",
        type=int,
        default=1,
        help="per decode worker (0: no attention-worker fault)",
    )
    p.add_argument(
        "--faults", default=",".join(FAULTS), help=f"in this order (default: {','.join(FAULTS)})"
    )
    p.add_argument(
        "--concurrency", type=int, default=defaults.concurrency, help="clients sending back to back"
    )
    p.add_argument("--max-tokens", type=int, default=defaults.max_tokens)
    p.add_argument(
        "--phase-seconds",
        type=float,
        default=defaults.phase_seconds,
        help="from one fault to the next",
    )
    p.add_argument(
        "--settle-seconds",
        type=float,
        default=defaults.settle_seconds,
        help="load alone before the first fault and after the last",
    )
    p.add_argument("--port", type=int, default=0, help="the gateway's port (0: a free one)")
    p.add_argument("--log-dir", default=".kvstack/chaos-logs")
    p.add_argument("--json", default="", help="also write the result to this file")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    faults = tuple(f.strip() for f in args.faults.split(",") if f.strip())
    if "attention-worker" in faults and not args.attention_workers:
        faults = tuple(f for f in faults if f != "attention-worker")
    config = ChaosConfig(
        faults, args.concurrency, args.max_tokens, args.settle_seconds, args.phase_seconds
    )
    say("computing the reference answers in this process ...")
    cases = reference_cases(config.model, config.max_tokens)
    stack = Stack(stack_config(args))
    try:
        say(f"starting the stack (logs in {args.log_dir}) ...")
        stack.start()
        stack.wait_ready()
        report = run_chaos(stack, cases, config, say)
    finally:
        say("stopping the stack ...")
        stack.stop()
    print(format_report(report, config))
    if args.json:
        Path(args.json).write_text(
            json.dumps({"config": asdict(config), **report.to_json()}, indent=2)
        )
    return 0 if report.ok else 1


def stack_config(args: argparse.Namespace) -> StackConfig:
    if min(args.prefill, args.decode) < 1:
        raise KvstackError("--prefill and --decode need at least 1 worker each")
    return StackConfig(
        num_prefill=args.prefill,
        num_decode=args.decode,
        num_kvstore=args.kvstore,
        num_attention=args.attention_workers,
        attention_args=("--kv-cache-gib", "0.25", "--threads", "1"),
        worker_args=WORKER_ARGS,
        gateway_args=("--dtype", "float32"),
        port=args.port or _free_port(),
        log_dir=Path(args.log_dir),
        restart=RestartPolicy(),
        drain_timeout=10.0,
    )


def reference_cases(model: str, max_tokens: int, topics: Sequence[str] = TOPICS) -> list[Case]:
    """Each topic's prompt and greedy answer from the engine alone, in this process
    (float32)."""
    from shared.engine.config import EngineConfig
    from shared.engine.engine import LLMEngine
    from shared.errors import KvstackError
    from shared.sampling_params import SamplingParams

    engine = LLMEngine(EngineConfig(model=model, dtype="float32", kv_cache_bytes=256 << 20))
    tokenizer = engine.info.tokenizer
    if tokenizer is None:
        raise KvstackError(f"{model} has no tokenizer: the chaos run sends chat prompts")
    prompts = [
        tokenizer.encode_chat([{"role": "user", "content": f"Tell me about {t}."}]) for t in topics
    ]
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    return [Case(tuple(c.prompt_token_ids), c.text) for c in engine.generate(prompts, params)]


HEADER = (
    "fault",
    "sent",
    "completed",
    "migrated",
    "errored",
    "lost",
    "hung",
    "back after (s)",
    "answering after (s)",
)


def format_report(report: ChaosReport, config: ChaosConfig) -> str:
    """A Markdown table (readable as is on a console) and the verdict."""
    rows = [
        (r.fault, r.sent, r.completed, r.migrated, r.errored, r.lost, r.hung,
         _seconds(r.back_s), _seconds(r.first_answer_s))
        for r in report.rows
    ]  # fmt: skip
    lines = markdown_table(HEADER, rows)
    total = sum(r.sent for r in report.rows)
    lines.append(
        f"\n{total} requests, {config.concurrency} clients, {config.max_tokens} "
        f"tokens each; KV blocks in use before {sum(report.kv_before.values())}, "
        f"after {sum(max(0, n) for n in report.kv_after.values())}"
    )
    lines += [f"error seen: {e}" for e in report.errors]
    if report.leaked:
        lines.append(f"LEAKED KV blocks: {report.leaked}")
    if report.silent:
        lines.append(f"NOT ANSWERING after the load: {', '.join(report.silent)}")
    lines.append("OK: nothing lost, nothing hung, no KV leaked" if report.ok else "FAILED")
    return "\n".join(lines)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    """The lines of a Markdown table (readable as is on a console)."""
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return lines + ["| " + " | ".join(map(str, cells)) + " |" for cells in rows]


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def say(message: str) -> None:
    print(f"bench chaos: {message}", file=sys.stderr, flush=True)
