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

from services import settings
from services.cli.service import backend_timeouts, engine_options
from services.settings import FORWARDED_BY_UP, flags, forward
from services.stack import prometheus_config
from services.stack.mooncake_master import MooncakeMaster, start_master
from services.stack.pinning import chosen_cores
from services.stack.ports import PortLayout
from services.stack.restarts import RestartPolicy
from services.stack.stack import Stack, StackConfig, say
from shared.attention_groups import kv_head_range
from shared.errors import KvstackError
from shared.model.config import ModelConfig
from shared.model.registry import resolve_model
from shared.runtime import tracing


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
    settings.add_command(p, "up")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    master = _start_mooncake_master(args)
    try:
        return _run(args, master.address if master is not None else "")
    finally:
        if master is not None:
            master.stop()


def _start_mooncake_master(args: argparse.Namespace) -> MooncakeMaster | None:
    """--kv-pool mooncake: the store's master, before the workers that join it."""
    if args.kv_pool != "mooncake":
        return None
    log = Path(args.log_dir) / "mooncake-master.log"
    master = start_master(log, extra_args=args.mooncake_master_args)
    say(f"mooncake_master on {master.address} (log {log})")
    return master


def _run(args: argparse.Namespace, mooncake_master: str) -> int:
    config = stack_config(args, mooncake_master)
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


def stack_config(args: argparse.Namespace, mooncake_master: str = "") -> StackConfig:
    if args.prefill < 1 or args.decode < 1 or args.conductors < 1:
        raise KvstackError("--conductors, --prefill and --decode need at least 1 each")
    mock = engine_options(args)["mock"]
    if mock is not None and args.attention_workers:
        raise KvstackError("--attention-workers does not run with --engine mock")
    if args.attention_workers:  # before starting anything, not after a dozen restarts
        kv_head_range(
            ModelConfig.from_dir(resolve_model(args.model)).num_kv_heads, args.attention_workers, 0
        )
    _check_nats_cluster(args)
    backend_timeouts(args)  # checked here, passed on as given
    if args.otlp_endpoint:  # missing packages: one error here, not a restart loop per child
        tracing.require()
    forwarded = {child: forward(args, names) for child, names in FORWARDED_BY_UP.items()}
    offload = flags(micro_batches=args.micro_batches) if args.attention_workers else []
    mooncake = args.kv_pool == "mooncake"
    if mooncake and not mooncake_master:
        raise KvstackError("--kv-pool mooncake: no mooncake_master was started")
    return StackConfig(
        nats_url=args.nats,
        nats_cluster=args.nats_cluster,
        num_conductors=args.conductors,
        lease_ttl=args.lease_ttl,
        num_prefill=args.prefill,
        num_decode=args.decode,
        num_kvstore=0 if mooncake else args.kvstore,  # NOTE: the store is the pool
        kvstore_args=(*flags(dram_gib=args.kvstore_dram_gib), *forwarded["kvstore"]),
        num_attention=args.attention_workers,
        attention_args=forwarded["attention-worker"],
        decode_args=tuple(offload),
        model=args.model,
        mock=mock,
        host=args.host,
        port=args.port,
        base_port=args.base_port or None,
        worker_args=(*forwarded["prefill"], *flags(mooncake_master=mooncake_master)),
        gateway_args=forwarded["gateway"],
        conductor_args=forwarded["conductor"],
        log_dir=Path(args.log_dir),
        drain_timeout=args.drain_timeout,
        restart=RestartPolicy(),
        metrics_port=_metrics_port(args),
        secrets_dir=Path(args.secrets_dir),
        insecure=args.insecure,
        api_key=not (args.insecure or args.api_key),  # else none, or the one given
        nats_tls=args.nats_tls,
        otlp_endpoint=args.otlp_endpoint,
        # NOTE: mock workers compute nothing; they are left unpinned.
        worker_cores=chosen_cores(args.cores) if mock is None else (),
        worker_devices=gpu_devices(args.gpus),
    )


def gpu_devices(gpus: str) -> tuple[str, ...]:
    """--gpus as CUDA device names: "" none, "all" every one torch sees, else indices;
    checked here, before any worker starts."""
    if not gpus:
        return ()
    import torch  # NOTE: only here: `up` itself runs no model and starts without torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise KvstackError(f"--gpus {gpus}: torch sees no CUDA device on this machine")
    if gpus == "all":
        return tuple(f"cuda:{i}" for i in range(count))
    try:
        indices = [int(part) for part in gpus.split(",")]
    except ValueError:
        raise KvstackError(f"--gpus takes all or device indices like 0,1, not {gpus!r}") from None
    wrong = [i for i in indices if not 0 <= i < count]
    if wrong:
        raise KvstackError(f"--gpus {gpus}: this machine has {count} CUDA device(s)")
    return tuple(f"cuda:{i}" for i in indices)


def _check_nats_cluster(args: argparse.Namespace) -> None:
    # NOTE: 2 nodes would lose JetStream's quorum (and the point) with either one
    if args.nats_cluster < 1 or args.nats_cluster == 2:
        raise KvstackError("--nats-cluster takes 1 (one nats-server) or 3 or more nodes")
    if args.nats_cluster > 1 and args.nats:
        raise KvstackError("--nats-cluster starts its own nodes; it does not go with --nats")


def run_until_stopped(stack: Stack, args: argparse.Namespace) -> None:
    """Start the stack, then keep it running until a signal or until a child keeps dying."""
    stack.start()
    say(
        f"starting {len(stack.processes)} services (logs in {args.log_dir}; "
        f"metrics of kvstack up on {stack.metrics.url}) ..."
    )
    _write_prometheus_config(stack, Path(args.prometheus_config))
    stack.wait_ready()
    mock = stack.config.mock
    serving = args.model if mock is None else f"mock {mock.model} on {mock.hardware}"
    if stack.api_key_file is not None:
        say(
            f"requests need the API key in {stack.api_key_file} (e.g. export "
            f"OPENAI_API_KEY=$(cat {stack.api_key_file}))"
        )
    print(f"kvstack is up: {stack.api_url}/v1  ({serving}; Ctrl-C stops it)", flush=True)
    while True:
        stack.check_alive()
        time.sleep(0.5)


def _metrics_port(args: argparse.Namespace) -> int:
    """--metrics-port as given, else the base port's slot (0, a free port, without one)."""
    if args.metrics_port is not None:
        return args.metrics_port
    return PortLayout(args.base_port).port("up") if args.base_port else 0


def _write_prometheus_config(stack: Stack, path: Path) -> None:
    if stack.config.base_port is None:
        say("no Prometheus config: --base-port 0 puts every service on a free port")
        return
    prometheus_config.write(path, stack.listeners())
    say(f"Prometheus config for this stack: {path} (services from port {stack.config.base_port})")


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
