"""`kvstack up`: the whole stack on this machine, until Ctrl-C.

A service that exits is restarted (`supervisor.py`); one that keeps dying stops the stack
with an error. Ctrl-C or SIGTERM drains (gateway first, nats-server last); a second one
kills every service at once.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import time
from pathlib import Path

from services.attention_worker.shard import kv_head_range
from services.cli.restarts import RestartPolicy
from services.cli.serve import add_engine, add_reliability, backend_timeouts, engine_options
from services.cli.stack import Stack, StackConfig, say
from shared.conductor.config import ADMISSION_MODES, POLICY_NAMES, SchedulingConfig
from shared.engine.config import DTYPE_CHOICES
from shared.errors import KvstackError
from shared.model.config import ModelConfig
from shared.model.registry import DEFAULT_MODEL, resolve_model


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "up",
        help="run nats-server, conductor, prefill, decode and gateway",
        description="Run the whole stack on this machine until Ctrl-C. With --engine mock the "
        "workers run no model: each step takes the cost model's time for "
        "--mock-model on --mock-hardware, KV bytes shrink by --mock-kv-scale, and "
        "the conductor predicts with the same cost model, so a cluster of e.g. "
        "--prefill 8 --decode 8 replays a trace on one machine (docs/mock.md).",
    )
    p.add_argument("--nats", default="", help="use this NATS server instead of starting one")
    p.add_argument("--prefill", type=int, default=1, help="number of prefill workers")
    p.add_argument("--decode", type=int, default=1, help="number of decode workers")
    p.add_argument("--kvstore", type=int, default=1, help="kvstore instances (0: none)")
    p.add_argument("--kvstore-dram-gib", type=float, default=2.0, help="per kvstore instance")
    p.add_argument(
        "--attention-workers",
        type=int,
        default=0,
        help="attention workers per decode worker (0: attention stays in decode); "
        "must divide the model's KV heads",
    )
    p.add_argument("--micro-batches", type=int, default=2, help="when offloading attention")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--kv-cache-gib", type=float, default=1.0, help="per worker")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--max-num-seqs", type=int, default=64, help="per worker (decode batch)")
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=2048,
        help="per worker and step (the prefill chunk)",
    )
    p.add_argument(
        "--long-prefill-tokens",
        type=int,
        default=None,
        help="most prompt tokens one request computes per step while others "
        "prefill too, so a long prompt cannot starve short ones (default: "
        "max-num-batched-tokens / 4; 0: no limit)",
    )
    add_engine(p)
    add_reliability(p)
    p.add_argument("--api-key", default="", help="require this bearer key at the gateway")
    p.add_argument(
        "--secrets-dir",
        default=".kvstack/secrets",
        help="NATS credentials (one user per service, each allowed only its own "
        "subjects), nats-server's config and the data plane's secret; made on "
        "first start, reused after (docs/security.md)",
    )
    p.add_argument(
        "--nats-tls",
        action="store_true",
        help="TLS on NATS with a CA of this deployment's own (in --secrets-dir)",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="no credentials: NATS lets anyone on this host in, the data plane "
        "takes any peer (for experiments only)",
    )
    p.add_argument(
        "--log-dir",
        default=".kvstack/logs",
        help="one log per service; the previous run's is kept as NAME.log.1",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="kvstack up's own /metrics (restarts, children up) on --host; 0: a "
        "free port, printed at start",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        help="seconds each service may take to finish its work when stopping",
    )
    scheduling = SchedulingConfig()
    p.add_argument("--policy", choices=POLICY_NAMES, default=scheduling.policy)
    p.add_argument("--admission", choices=ADMISSION_MODES, default=scheduling.admission)
    p.add_argument("--slo-ttft", type=float, default=scheduling.slo_ttft, help="seconds")
    p.add_argument("--slo-tbt", type=float, default=scheduling.slo_tbt, help="seconds")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    config = stack_config(args)
    say(f"preparing {args.model} ...")
    resolve_model(args.model)  # convert once here, not in every worker at the same time
    stack = Stack(config)
    # also when started with SIGINT ignored (in the background)
    _on_signals(lambda *_: _interrupt(stack))
    try:
        run_until_stopped(stack, args)
    except KeyboardInterrupt:
        pass
    finally:
        shut_down(stack)
    return 0


def stack_config(args: argparse.Namespace) -> StackConfig:
    if args.prefill < 1 or args.decode < 1:
        raise KvstackError("--prefill and --decode need at least 1 worker each")
    mock = engine_options(args)["mock"]
    if mock is not None and args.attention_workers:
        raise KvstackError("--attention-workers does not run with --engine mock")
    if args.attention_workers:  # before starting anything, not after a dozen restarts
        kv_head_range(
            ModelConfig.from_dir(resolve_model(args.model)).num_kv_heads, args.attention_workers, 0
        )
    timeouts = backend_timeouts(args)
    context = ("--max-model-len", str(args.max_model_len)) if args.max_model_len else ()
    long_prefill = (
        ("--long-prefill-tokens", str(args.long_prefill_tokens))
        if args.long_prefill_tokens is not None
        else ()
    )
    worker_args = (
        "--dtype",
        args.dtype,
        "--kv-cache-gib",
        str(args.kv_cache_gib),
        "--threads",
        str(args.threads),
        "--max-num-seqs",
        str(args.max_num_seqs),
        "--max-num-batched-tokens",
        str(args.max_num_batched_tokens),
        *long_prefill,
        *context,
    )
    gateway_args = (
        "--dtype",
        args.dtype,
        *context,
        "--migration-limit",
        str(timeouts.migration_limit),
        "--placement-wait",
        str(timeouts.placement_wait),
        *(("--api-key", args.api_key) if args.api_key else ()),
    )
    conductor_args = (
        "--model",
        args.model,
        "--policy",
        args.policy,
        "--admission",
        args.admission,
        "--slo-ttft",
        str(args.slo_ttft),
        "--slo-tbt",
        str(args.slo_tbt),
    )
    return StackConfig(
        nats_url=args.nats,
        num_prefill=args.prefill,
        num_decode=args.decode,
        num_kvstore=args.kvstore,
        kvstore_args=("--dram-gib", str(args.kvstore_dram_gib)),
        num_attention=args.attention_workers,
        attention_args=("--kv-cache-gib", str(args.kv_cache_gib), "--threads", str(args.threads)),
        decode_args=("--micro-batches", str(args.micro_batches)) if args.attention_workers else (),
        model=args.model,
        mock=mock,
        host=args.host,
        port=args.port,
        worker_args=worker_args,
        gateway_args=gateway_args,
        conductor_args=conductor_args,
        log_dir=Path(args.log_dir),
        drain_timeout=args.drain_timeout,
        restart=RestartPolicy(),
        metrics_port=args.metrics_port,
        secrets_dir=Path(args.secrets_dir),
        insecure=args.insecure,
        nats_tls=args.nats_tls,
    )


def run_until_stopped(stack: Stack, args: argparse.Namespace) -> None:
    """Start the stack, then keep it running until a signal or until a child keeps dying."""
    stack.start()
    say(
        f"starting {len(stack.processes)} services (logs in {args.log_dir}; "
        f"metrics of kvstack up on {stack.metrics.url}) ..."
    )
    stack.wait_ready()
    mock = stack.config.mock
    serving = args.model if mock is None else f"mock {mock.model} on {mock.hardware}"
    print(f"kvstack is up: {stack.api_url}/v1  ({serving}; Ctrl-C stops it)", flush=True)
    while True:
        stack.check_alive()
        time.sleep(0.5)


def shut_down(stack: Stack) -> None:
    """Drain and stop; a second Ctrl-C (or SIGTERM) meanwhile kills every child at once."""
    _on_signals(lambda *_: _force(stack))
    say("draining (Ctrl-C again to force) ...")
    stack.stop()
    _on_signals(signal.SIG_IGN)
    say("stopped")


def _interrupt(stack: Stack) -> None:
    """The first Ctrl-C or SIGTERM: leave what runs now for shut_down; the next forces."""
    _on_signals(lambda *_: _force(stack))
    raise KeyboardInterrupt


def _force(stack: Stack) -> None:
    stack.kill()  # the stop() in progress then finds them gone
    with contextlib.suppress(RuntimeError):  # stderr may be mid-write where we interrupted
        say("forcing the stop: killed every service")


def _on_signals(handler) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handler)
