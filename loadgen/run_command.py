"""`loadgen run`: measure a live OpenAI-compatible endpoint the way `vllm bench serve` does,
and write the console summary, the result JSON (with every request's record) and plots."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import math
import os
import sys
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import aiohttp
import orjson

from loadgen import datasets
from loadgen.arrivals import arrival_times
from loadgen.client import Target
from loadgen.console import format_summary
from loadgen.datasets import Prompt, TokenSpace
from loadgen.metrics import describe, parse_goodput, summarize
from loadgen.output import build_result, save_result
from loadgen.plots import NO_MATPLOTLIB
from loadgen.preflight import normalize_base_url, resolve_model, served_models
from loadgen.progress import Progress
from loadgen.runner import Runner, RunOutcome
from loadgen.trace import load_trace
from shared.errors import KvstackError

DATASETS = ("random", "shared-prefix", "mooncake-trace")
TRACE_ONLY = ("dataset_path", "max_requests", "duration", "time_scale", "length_scale")
INTERRUPTED_EXIT = 130


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="measure a live OpenAI-compatible endpoint",
        description=__doc__,
        formatter_class=DefaultsFormatter,
    )
    add_target_args(p.add_argument_group("endpoint"))
    add_dataset_args(p.add_argument_group("dataset"))
    add_load_args(p.add_argument_group("load"))
    add_output_args(p.add_argument_group("metrics and output"))
    p.set_defaults(run=run)


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except unset (None) and off (False) ones."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None or action.default is False:
            return action.help or ""
        return super()._get_help_string(action) or ""


def add_target_args(g) -> None:
    g.add_argument(
        "--base-url",
        default="http://127.0.0.1:8000",
        help="the server's root URL (a trailing /v1 is accepted)",
    )
    g.add_argument("--api-key", help="bearer key (default: $OPENAI_API_KEY)")
    g.add_argument("--model", help="model name (default: the first of GET /v1/models)")
    g.add_argument(
        "--endpoint",
        choices=("completions", "chat"),
        default="completions",
        help="/v1/completions (token-id prompts) or /v1/chat/completions (text)",
    )
    g.add_argument(
        "--extra-body",
        type=json_object,
        default={},
        metavar="JSON",
        help="fields merged into every request body, e.g. '{\"min_tokens\": 128}'",
    )
    g.add_argument(
        "--request-ids",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="send x-request-id: loadgen-<index> (llama-cpp-python refuses ids not UUIDs)",
    )
    g.add_argument(
        "--ignore-eos",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="ask for exactly max_tokens tokens (vLLM's extension field)",
    )


def add_dataset_args(g) -> None:
    g.add_argument("--dataset", choices=DATASETS, default="random", help="what to send")
    g.add_argument(
        "--dataset-path",
        "--trace",
        dest="dataset_path",
        metavar="FILE",
        help="mooncake-trace: the JSONL trace",
    )
    g.add_argument(
        "--text-prompts",
        action="store_true",
        help="completions: send words instead of token ids (for servers that take text only)",
    )
    g.add_argument("--num-prompts", type=int, default=100, help="random: requests to send")
    g.add_argument("--input-len", type=int, default=1024, help="random: prompt tokens")
    g.add_argument("--output-len", type=int, default=128, help="random, shared-prefix: max_tokens")
    g.add_argument(
        "--range-ratio",
        type=float,
        default=0.0,
        help="random: lengths uniform in [len*(1-r), len*(1+r)]",
    )
    g.add_argument("--num-groups", type=int, default=8, help="shared-prefix: prefixes")
    g.add_argument("--prompts-per-group", type=int, default=8, help="shared-prefix")
    g.add_argument("--prefix-len", type=int, default=1024, help="shared-prefix: tokens")
    g.add_argument("--suffix-len", type=int, default=128, help="shared-prefix: tokens")
    g.add_argument(
        "--vocab-size",
        type=int,
        default=datasets.DEFAULT_VOCAB_SIZE,
        help=f"token ids are drawn from [{datasets.FIRST_SAFE_TOKEN_ID}, this)",
    )
    g.add_argument("--max-requests", type=int, help="mooncake-trace: the first N rows")
    g.add_argument(
        "--duration",
        type=float,
        help="mooncake-trace: rows arriving before S seconds (after --time-scale)",
    )
    g.add_argument(
        "--time-scale",
        type=float,
        help="mooncake-trace: multiply timestamps (2.0 = half speed; default 1)",
    )
    g.add_argument(
        "--length-scale",
        type=float,
        help="mooncake-trace: shrink input and output lengths (0.05 = 5%%; "
        "blocks of round(512*scale) tokens per hash id; default 1)",
    )


def add_load_args(g) -> None:
    g.add_argument(
        "--request-rate",
        type=float,
        default=math.inf,
        help="requests/s (inf: all at t=0); ignored for mooncake-trace",
    )
    g.add_argument(
        "--burstiness",
        type=float,
        default=1.0,
        help="gamma shape of the gaps: 1 Poisson, <1 burstier, >1 more even",
    )
    g.add_argument("--max-concurrency", type=int, help="requests in flight at most")
    g.add_argument("--seed", type=int, default=0, help="prompts, lengths and arrivals")


def add_output_args(g) -> None:
    g.add_argument(
        "--goodput",
        nargs="+",
        default=[],
        metavar="KEY:MS",
        help="SLOs for goodput, e.g. ttft:500 tpot:50 e2el:10000",
    )
    g.add_argument("--metric-percentiles", default="50,90,99", help="e.g. 50,90,99")
    g.add_argument("--label", help="names the run (default: the dataset)")
    g.add_argument("--result-dir", default="loadgen-results", help="where the JSON goes")
    g.add_argument(
        "--output-json", help="the result's path (default: a timestamped name under --result-dir)"
    )
    g.add_argument("--save-records", metavar="PATH", help="also write the records as JSONL")
    g.add_argument("--plot-dir", help="where PNG plots go (default: beside the JSON)")
    g.add_argument("--no-plots", action="store_true", help="write no PNG plots")


# -- the command -------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    check_args(args)
    percentiles = parse_percentiles(args.metric_percentiles)
    slos = parse_goodput(args.goodput)
    api_key = args.api_key or os.environ.get("OPENAI_API_KEY")
    target = Target(
        normalize_base_url(args.base_url),
        args.model or "",
        args.endpoint,
        api_key,
        args.ignore_eos,
        args.extra_body,
        args.request_ids,
    )
    prompts = build_prompts(args)
    arrivals = schedule(args, prompts)
    target, outcome = asyncio.run(measure(target, prompts, arrivals, args.max_concurrency))
    result = build_result(
        run_summary(outcome, slos, percentiles, args),
        outcome.records,
        run_meta(args, target, outcome),
    )
    print(format_summary(result))
    write_outputs(result, args)
    return exit_code(outcome)


def json_object(text: str) -> dict:
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"a JSON object is needed, got {text!r}")
    return value


def check_args(args: argparse.Namespace) -> None:
    is_trace = args.dataset == "mooncake-trace"
    misplaced = [name for name in TRACE_ONLY if getattr(args, name) is not None]
    if not is_trace and misplaced:
        raise KvstackError(
            f"--{misplaced[0].replace('_', '-')} applies to --dataset mooncake-trace only"
        )
    if is_trace and not args.dataset_path:
        raise KvstackError("--dataset mooncake-trace needs --dataset-path FILE")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise KvstackError(f"--max-concurrency must be at least 1, got {args.max_concurrency}")
    if is_trace and not math.isinf(args.request_rate):
        print(
            "note: --request-rate is ignored for mooncake-trace: the trace's timestamps "
            "are the schedule",
            file=sys.stderr,
        )


def parse_percentiles(text: str) -> list[float]:
    try:
        values = [float(item) for item in text.split(",") if item.strip()]
    except ValueError:
        values = []
    if not values or not all(0 < v <= 100 for v in values):
        raise KvstackError(
            f"--metric-percentiles must be comma-separated numbers in (0, 100], got {text!r}"
        )
    return values


def build_prompts(args: argparse.Namespace) -> list[Prompt]:
    space = TokenSpace(args.vocab_size, as_text=args.endpoint == "chat" or args.text_prompts)
    if args.dataset == "random":
        return datasets.random_prompts(
            args.num_prompts, args.input_len, args.output_len, args.range_ratio, space, args.seed
        )
    if args.dataset == "shared-prefix":
        return datasets.shared_prefix_prompts(
            args.num_groups,
            args.prompts_per_group,
            args.prefix_len,
            args.suffix_len,
            args.output_len,
            space,
            args.seed,
        )
    rows = load_trace(args.dataset_path, args.max_requests, args.duration, args.time_scale or 1.0)
    return datasets.trace_prompts(rows, args.length_scale or 1.0, space, args.seed)


def trace_arrivals(prompts: list[Prompt]) -> list[float]:
    """Each trace prompt's own arrival (a trace row always has its timestamp)."""
    arrivals = [prompt.arrival for prompt in prompts if prompt.arrival is not None]
    if len(arrivals) != len(prompts):
        raise KvstackError("a mooncake-trace prompt without its arrival time")
    return arrivals


def schedule(args: argparse.Namespace, prompts: list[Prompt]) -> list[float]:
    if not prompts:
        raise KvstackError("no requests to send (is --duration or --max-requests too small?)")
    if args.dataset == "mooncake-trace":
        return trace_arrivals(prompts)
    return arrival_times(len(prompts), args.request_rate, args.burstiness, args.seed)


async def measure(
    target: Target, prompts: list[Prompt], arrivals: list[float], max_concurrency: int | None
) -> tuple[Target, RunOutcome]:
    async with aiohttp.ClientSession() as session:
        listed = await served_models(session, target.base_url, target.api_key)
        target = replace(target, model=await resolve_model(session, target, listed))
    print(
        f"loadgen: {len(prompts)} requests to {target.url} (model {target.model})", file=sys.stderr
    )
    progress = Progress(len(prompts))
    outcome = await Runner(target, max_concurrency, progress).run(prompts, arrivals)
    progress.close("interrupted: results so far" if outcome.interrupted else "")
    return target, outcome


def run_summary(
    outcome: RunOutcome, slos: dict, percentiles: list[float], args: argparse.Namespace
) -> dict:
    summary = summarize(outcome.records, outcome.duration, slos, percentiles)
    if args.max_concurrency:
        queue_times = [r.queue_time for r in outcome.records]
        summary.update(describe("client_queue_time", queue_times, percentiles))
    return summary


def run_meta(args: argparse.Namespace, target: Target, outcome: RunOutcome) -> dict:
    is_trace = args.dataset == "mooncake-trace"
    rate = "trace" if is_trace else ("inf" if math.isinf(args.request_rate) else args.request_rate)
    backend = "openai-chat" if target.endpoint == "chat" else "openai"
    return {
        "backend": backend,
        "endpoint_type": backend,
        "label": args.label or args.dataset,
        "model_id": target.model,
        "tokenizer_id": None,
        "base_url": target.base_url,
        "endpoint": target.url.removeprefix(target.base_url),
        "dataset": dataset_meta(args),
        "request_rate": rate,
        "burstiness": None if is_trace else args.burstiness,
        "max_concurrency": args.max_concurrency,
        "seed": args.seed,
        "ignore_eos": target.ignore_eos,
        "interrupted": outcome.interrupted,
        "num_cancelled": outcome.num_cancelled,
        "num_unsent": outcome.num_unsent,
    }


def dataset_meta(args: argparse.Namespace) -> dict:
    names = {
        "random": ("num_prompts", "input_len", "output_len", "range_ratio"),
        "shared-prefix": (
            "num_groups",
            "prompts_per_group",
            "prefix_len",
            "suffix_len",
            "output_len",
        ),
        "mooncake-trace": TRACE_ONLY,
    }[args.dataset]
    return {
        "name": args.dataset,
        "vocab_size": args.vocab_size,
        **{name: getattr(args, name) for name in names},
    }


def write_outputs(result: dict, args: argparse.Namespace) -> None:
    path = save_result(result, args.output_json or default_json_path(result, args))
    print(f"result: {path}", file=sys.stderr)
    if args.save_records:
        write_records(result["records"], Path(args.save_records))
    if args.no_plots:
        return
    # Plots by default only where matplotlib is installed (the bench extra); asked for by
    # --plot-dir, a missing matplotlib is a usage error (after the JSON is safe).
    if not args.plot_dir and importlib.util.find_spec("matplotlib") is None:
        print(f"no plots: {NO_MATPLOTLIB}", file=sys.stderr)
        return
    from loadgen.plots import plot_run  # matplotlib loads only when plotting

    plot_dir = Path(args.plot_dir) if args.plot_dir else path.parent
    for plot in plot_run(result, plot_dir, prefix=f"{path.stem}-"):
        print(f"plot: {plot}", file=sys.stderr)


def default_json_path(result: dict, args: argparse.Namespace) -> Path:
    """vLLM's `{label}-{rate}qps[-concurrency{N}]-{model}-{YYYYmmdd-HHMMSS}.json`."""
    rate = result["request_rate"]
    parts = [result["label"], "trace" if rate == "trace" else f"{rate}qps"]
    if args.max_concurrency:
        parts.append(f"concurrency{args.max_concurrency}")
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    parts += [result["model_id"].rstrip("/").split("/")[-1], stamp]
    return Path(args.result_dir) / ("-".join(str(p) for p in parts) + ".json")


def write_records(records: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(record) + b"\n" for record in records))


def exit_code(outcome: RunOutcome) -> int:
    if outcome.interrupted:
        return INTERRUPTED_EXIT
    return 0 if any(r.success for r in outcome.records) else 1
