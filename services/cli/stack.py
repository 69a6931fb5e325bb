"""A whole kvstack on this machine: nats-server plus one process per service.

Used by `kvstack up` and by the end-to-end tests, so what is tested is what users run.
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from shared import codec, subjects
from shared.engine.mock import MockSpec
from shared.errors import KvstackError
from shared.messages import Heartbeat
from shared.nats_server import NatsServer


@dataclass(frozen=True)
class StackConfig:
    nats_url: str = ""                 # empty: start a local nats-server
    num_prefill: int = 1
    num_decode: int = 1
    num_kvstore: int = 0
    kvstore_args: tuple[str, ...] = ()
    num_attention: int = 0             # attention workers per decode worker (0: no offload)
    attention_args: tuple[str, ...] = ()
    model: str = "SmolLM2-135M-Instruct"
    mock: MockSpec | None = None       # workers run the mock engine (model: the tokenizer)
    host: str = "127.0.0.1"
    port: int = 8000
    worker_args: tuple[str, ...] = ()  # extra args for prefill and decode workers
    decode_args: tuple[str, ...] = ()  # extra args for decode workers only
    prefill_args: tuple[str, ...] = ()  # extra args for prefill workers only
    gateway_args: tuple[str, ...] = ()
    conductor_args: tuple[str, ...] = ()
    with_conductor: bool = True
    with_gateway: bool = True
    log_dir: Path = Path(".kvstack/logs")
    ready_timeout: float = 300.0


@dataclass
class Process:
    name: str
    args: list[str]        # after `kvstack`: the service first
    popen: subprocess.Popen
    log_path: Path

    @property
    def service(self) -> str:
        return self.args[0]


@dataclass
class Stack:
    config: StackConfig
    nats: NatsServer | None = None
    nats_url: str = ""
    processes: list[Process] = field(default_factory=list)

    @property
    def api_url(self) -> str:
        return f"http://{self.config.host}:{self.config.port}"

    def start(self) -> None:
        self.config.log_dir.mkdir(parents=True, exist_ok=True)
        if self.config.nats_url:
            self.nats_url = self.config.nats_url
        else:
            self.nats = NatsServer()
            self.nats_url = self.nats.url
        for name, args in self.commands():
            self.spawn(name, args)

    def commands(self) -> list[tuple[str, list[str]]]:
        cfg = self.config
        engine = engine_args(cfg.mock)
        worker = ["--model", cfg.model, *engine, *cfg.worker_args]
        # The conductor predicts with the cost model the mock workers take their time from.
        cost = ["--cost-model", cfg.mock.cost_spec] if cfg.mock is not None else []
        commands = [("conductor-0", ["conductor", "--worker-id", "conductor-0", *cost,
                                     *cfg.conductor_args])]
        commands = commands if cfg.with_conductor else []
        commands += [(f"kvstore-{i}", ["kvstore", "--worker-id", f"kvstore-{i}",
                                       *cfg.kvstore_args]) for i in range(cfg.num_kvstore)]
        commands += [(f"prefill-{i}", ["prefill", "--worker-id", f"prefill-{i}", *worker,
                                       *cfg.prefill_args]) for i in range(cfg.num_prefill)]
        for i in range(cfg.num_decode):
            group = [f"attention-{i}-{j}" for j in range(cfg.num_attention)]
            commands += [(w, ["attention-worker", "--worker-id", w, *cfg.attention_args])
                         for w in group]
            offload = ["--attention-workers", ",".join(group)] if group else []
            commands.append((f"decode-{i}", ["decode", "--worker-id", f"decode-{i}", *worker,
                                             *offload, *cfg.decode_args]))
        if cfg.with_gateway:
            commands.append(("gateway-0", [
                "gateway", "--worker-id", "gateway-0", "--model", cfg.model, "--host", cfg.host,
                "--http-port", str(cfg.port), *engine, *cfg.gateway_args]))
        return commands

    def spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Process:
        """Run `kvstack <args>`; the NATS URL comes from KVSTACK_NATS unless args give one."""
        log_path = self.config.log_dir / f"{name}.log"
        argv = [sys.executable, "-m", "services.cli.main", *args]
        env = {**os.environ, "KVSTACK_NATS": self.nats_url, "PYTHONUNBUFFERED": "1",
               **(env or {})}
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True, preexec_fn=_die_with_parent)
        process = Process(name, list(args), popen, log_path)
        self.processes.append(process)
        return process

    def wait_ready(self) -> None:
        """Until every service beats and the gateway answers /health; raises on a crash."""
        expected = Counter(p.service for p in self.processes)
        asyncio.run(self._await_heartbeats(expected, time.monotonic() + self.config.ready_timeout))
        if self.config.with_gateway:
            self._await_gateway(time.monotonic() + 30)

    async def _await_heartbeats(self, expected: Counter, deadline: float) -> None:
        import nats
        seen: dict[str, str] = {}   # worker id -> service
        nc = await nats.connect(self.nats_url, error_cb=_quiet, max_reconnect_attempts=3)

        async def on_beat(msg) -> None:
            beat = codec.decode(msg.data, Heartbeat)
            seen[beat.worker_id] = beat.service
        await nc.subscribe(subjects.all_heartbeats(), cb=on_beat)
        try:
            while missing := expected - Counter(seen.values()):
                self.check_alive()
                if time.monotonic() > deadline:
                    raise KvstackError(f"not ready within {self.config.ready_timeout:.0f}s: "
                                       f"waiting for {', '.join(sorted(missing))}")
                await asyncio.sleep(0.2)
        finally:
            await nc.close()

    def _await_gateway(self, deadline: float) -> None:
        while True:
            self.check_alive()
            try:
                with urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise KvstackError(f"gateway at {self.api_url} never became healthy")
            time.sleep(0.2)

    def check_alive(self) -> None:
        for process in self.processes:
            code = process.popen.poll()
            if code is not None:
                raise KvstackError(f"{process.name} exited with code {code}; its log "
                                   f"({process.log_path}) ends with:\n{tail(process.log_path)}")

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM in reverse start order (gateway first, so nothing new comes in), then wait."""
        for process in reversed(self.processes):
            _signal(process, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for process in reversed(self.processes):
            try:
                process.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal(process, signal.SIGKILL)
                process.popen.wait()
        if self.nats is not None:
            self.nats.stop()


def engine_args(mock: MockSpec | None) -> list[str]:
    """The engine flags of workers and gateway (`kvstack prefill --engine ...`)."""
    if mock is None:
        return []
    return ["--engine", "mock", "--mock-model", mock.model, "--mock-hardware", mock.hardware,
            "--mock-kv-scale", repr(mock.kv_scale)]


async def _quiet(e: Exception) -> None:
    pass


def _die_with_parent() -> None:
    """In the child: get SIGTERM if `kvstack up` dies, so no service outlives it (Linux)."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _signal(process: Process, sig: int) -> None:
    if process.popen.poll() is None:
        try:
            os.killpg(process.popen.pid, sig)
        except ProcessLookupError:
            pass


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
