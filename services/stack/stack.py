"""A whole kvstack on this machine: nats-server plus one process per service.

Used by `kvstack up` and by the end-to-end tests, so what is tested is what users run.

    stack = Stack(StackConfig(..., restart=RestartPolicy(), metrics_port=0))
    stack.start()         # nats-server first, then every service; logs rotated
    stack.wait_ready()    # until every service beats and the gateway answers /health
    ...
    stack.stop()          # drains: gateway, workers, attention workers, the rest, nats last

With `restart` set, `start()` also starts the supervisor (`supervisor.py`): a child that
exits, nats-server included, is started again with the same command line after a
backoff, and `check_alive()` raises only once it gave up on one. Without it (the
tests that kill a child on purpose) any exited child makes `check_alive()` raise.
For fault tests: `process(name)` is the live `Process` (its `popen` changes on a
restart), `restarts(name)` counts its restarts, `restart_nats()` stops nats-server and
starts it again on the same port, `kill()` SIGKILLs every child and nats-server at once
(then `stop()` reaps them and cleans up).
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from services.settings import flags
from services.stack import process as stack_process
from services.stack.auth import StackAuth
from services.stack.logs import rotate, tail
from services.stack.metrics import UpMetrics
from services.stack.ports import Listener, PortLayout, check_free
from services.stack.process import Process, stop_tiers
from services.stack.restarts import RestartPolicy
from services.stack.supervisor import Child, Supervisor
from shared import codec, subjects
from shared.auth.credentials import NatsAuth
from shared.auth.deployment import Identity, read_api_key, read_data_token
from shared.cpu_cores import format_cores, plan_cores
from shared.engine.mock import MockSpec
from shared.errors import KvstackError
from shared.messages import Heartbeat
from shared.runtime.bus import Bus, server_urls
from shared.runtime.child_process import kill_group
from shared.runtime.nats_cluster import NatsCluster
from shared.runtime.nats_server import NatsServer

MODEL_WORKERS = ("prefill", "decode", "attention-worker")  # the services pinned to cores
STOP_GRACE = 20.0  # seconds a service may take past its drain to stop and deregister
PROGRESS_EVERY = 5.0  # seconds between "waiting for ..." lines while starting


@dataclass(frozen=True)
class StackConfig:
    nats_url: str = ""  # empty: start a local nats-server
    nats_cluster: int = 1  # nodes of the local NATS (2 or more: a cluster on loopback)
    num_prefill: int = 1
    num_decode: int = 1
    num_kvstore: int = 0
    kvstore_args: tuple[str, ...] = ()
    num_attention: int = 0  # attention workers per decode worker (0: no offload)
    attention_args: tuple[str, ...] = ()
    model: str = "SmolLM2-135M-Instruct"
    mock: MockSpec | None = None  # workers run the mock engine (model: the tokenizer)
    host: str = "127.0.0.1"
    port: int = 8000
    base_port: int | None = None  # fixed HTTP ports from here (ports.py); None: free ones
    worker_args: tuple[str, ...] = ()  # extra args for prefill and decode workers
    decode_args: tuple[str, ...] = ()  # extra args for decode workers only
    prefill_args: tuple[str, ...] = ()  # extra args for prefill workers only
    gateway_args: tuple[str, ...] = ()
    conductor_args: tuple[str, ...] = ()
    with_conductor: bool = True
    num_conductors: int = 1  # above 1: one active, elected by a lease of `lease_ttl` seconds
    lease_ttl: float = 1.0
    with_gateway: bool = True
    log_dir: Path = Path(".kvstack/logs")
    ready_timeout: float = 300.0
    drain_timeout: float = 30.0  # every child's --drain-timeout
    restart: RestartPolicy | None = None  # None: no supervisor, an exited child is an error
    metrics_port: int | None = None  # the stack's own /metrics (0: a free port; None: off)
    secrets_dir: Path | None = None  # credentials, kept across runs (None: temporary)
    insecure: bool = False  # no NATS users, no data-plane secret, no API key
    api_key: bool = False  # the gateway requires a key kept with the secrets (`api_key_file`)
    nats_tls: bool = False  # TLS on NATS, with the deployment's own CA
    otlp_endpoint: str = ""  # every child's --otlp-endpoint ("": tracing off)
    worker_cores: tuple[int, ...] = ()  # shared out among the model workers (shared/cpu_cores.py);
    # empty: none is pinned
    worker_devices: tuple[str, ...] = ()  # CUDA devices shared out among the prefill and
    # decode workers, round robin; empty: each takes its --device


@dataclass
class Stack:
    config: StackConfig
    nats: NatsServer | NatsCluster | None = None
    nats_url: str = ""
    processes: list[Process] = field(default_factory=list)
    metrics: UpMetrics = field(default_factory=UpMetrics)
    supervisor: Supervisor | None = None
    auth: StackAuth | None = None
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)
    _logs_begun: set[str] = field(default_factory=set, repr=False)

    @property
    def api_url(self) -> str:
        return f"http://{self.config.host}:{self.config.port}"

    def start(self) -> None:
        cfg = self.config
        cfg.log_dir.mkdir(parents=True, exist_ok=True)
        check_free([x for x in self.listeners() if x.port])
        if cfg.metrics_port is not None:
            self._serve_metrics(cfg.metrics_port)
        identities = [Identity(args[0], name) for name, args in self.commands()]
        self.auth = StackAuth.prepare(cfg.secrets_dir, identities, cfg.insecure, cfg.nats_tls)
        if cfg.api_key:
            self.auth.require_api_key()
        if cfg.nats_url:
            self.nats_url = cfg.nats_url
        else:
            self.nats = self._start_nats(self.auth)
            self.nats_url = self.nats.url
        for name, args in self.commands():
            self.spawn(name, args)
        if cfg.restart is not None:
            self.supervisor = Supervisor(cfg.restart, self._children, self._lock, self.metrics, say)
            self.supervisor.start()

    def _start_nats(self, auth: StackAuth) -> NatsServer | NatsCluster:
        """One nats-server, or with `nats_cluster` > 1 a cluster routed on loopback (then
        `nats_url` lists every node)."""
        if self.config.nats_cluster < 2:
            return NatsServer(log_path=self._log_path(NatsServer.name), config=auth.server_config)
        for i in range(self.config.nats_cluster):
            self._log_path(f"nats-server-{i}")  # rotates last run's log
        cluster = NatsCluster(
            self.config.nats_cluster,
            self.config.log_dir,
            auth.server_config,
            auth.route_credentials(),
            auth.tls_dir,
        )
        try:
            cluster.wait_routed(auth.admin())
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _serve_metrics(self, port: int) -> None:
        host = self.config.host
        try:
            self.metrics.serve(host, port)
        except OSError as e:
            raise KvstackError(f"cannot serve metrics on {host}:{port}: {e.strerror}") from None

    def commands(self) -> list[tuple[str, list[str]]]:
        """Each child's name and `kvstack` command line (flags from `settings.py`)."""
        cfg = self.config
        engine = engine_args(cfg.mock)
        worker = [*flags(model=cfg.model), *engine, *cfg.worker_args]
        # The conductor predicts with the cost model the mock workers take their time from.
        cost = flags(cost_model=cfg.mock.cost_spec) if cfg.mock is not None else []
        commands = self._conductors([*cost, *cfg.conductor_args]) if cfg.with_conductor else []
        commands += [
            (f"kvstore-{i}", ["kvstore", *cfg.kvstore_args]) for i in range(cfg.num_kvstore)
        ]
        commands += [
            (f"prefill-{i}", ["prefill", *worker, *cfg.prefill_args])
            for i in range(cfg.num_prefill)
        ]
        for i in range(cfg.num_decode):
            group = [f"attention-{i}-{j}" for j in range(cfg.num_attention)]
            commands += [(w, ["attention-worker", *cfg.attention_args]) for w in group]
            offload = flags(attention_workers=",".join(group))
            commands.append((f"decode-{i}", ["decode", *worker, *offload, *cfg.decode_args]))
        if cfg.with_gateway:
            http = flags(model=cfg.model, host=cfg.host, http_port=cfg.port)
            commands.append(("gateway-0", ["gateway", *http, *engine, *cfg.gateway_args]))
        every = flags(drain_timeout=f"{cfg.drain_timeout:g}", otlp_endpoint=cfg.otlp_endpoint)
        ports, cores = self._fixed_ports(commands), self._cores(commands)
        devices = self._devices(commands)
        return [
            (
                name,
                [
                    command,
                    *flags(worker_id=name, http_port=ports.get(name), cores=cores.get(name)),
                    *args,
                    *flags(device=devices.get(name)),  # after the forwarded --device: wins
                    *every,
                ],
            )
            for name, (command, *args) in commands
        ]

    def _devices(self, commands: list[tuple[str, list[str]]]) -> dict[str, str]:
        """Each prefill and decode worker's CUDA device, round robin over `worker_devices`
        (attention workers stay on the CPU: Lamina's memory-rich side)."""
        devices = self.config.worker_devices
        if not devices:
            return {}
        workers = [name for name, (command, *_) in commands if command in ("prefill", "decode")]
        return {name: devices[i % len(devices)] for i, name in enumerate(workers)}

    def _conductors(self, args: list[str]) -> list[tuple[str, list[str]]]:
        cfg = self.config
        if cfg.num_conductors > 1:
            args = [*args, *flags(lease_ttl=f"{cfg.lease_ttl:g}")]
        return [(f"conductor-{i}", ["conductor", *args]) for i in range(cfg.num_conductors)]

    def _cores(self, commands: list[tuple[str, list[str]]]) -> dict[str, str]:
        """Each model worker's --cores by its name, planned over `worker_cores`."""
        if not self.config.worker_cores:
            return {}
        workers = [name for name, (command, *_) in commands if command in MODEL_WORKERS]
        plan = plan_cores(self.config.worker_cores, workers) if workers else {}
        return {name: format_cores(cores) for name, cores in plan.items()}

    def _fixed_ports(self, commands: list[tuple[str, list[str]]]) -> dict[str, int]:
        """Each child's HTTP port by its name, from the base port (none without one; the
        gateway's is --port)."""
        if self.config.base_port is None:
            return {}
        layout, seen = PortLayout(self.config.base_port), Counter[str]()
        ports = {}
        for name, (command, *_) in commands:
            if command != "gateway":
                ports[name] = layout.port(command, seen[command])
                seen[command] += 1
        return ports

    def listeners(self) -> list[Listener]:
        """Every HTTP endpoint of the stack with its port (0: a free one, known later)."""
        cfg = self.config
        children = [
            Listener(
                name, args[0], cfg.host if args[0] == "gateway" else "127.0.0.1", _http_port(args)
            )
            for name, args in self.commands()
        ]
        if cfg.metrics_port is not None:
            port = self.metrics.port or cfg.metrics_port  # served: the port it got
            children.append(Listener("up", "up", cfg.host, port))
        return children

    def spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Process:
        """Run `kvstack <args>`; the NATS URL comes from KVSTACK_NATS unless args give one,
        its credentials (worker id `name`, role `args[0]`) from KVSTACK_NATS_CREDS."""
        if self.auth is None:  # spawned without start(): against a server of the caller's
            cfg = self.config
            self.auth = StackAuth.prepare(cfg.secrets_dir, [], cfg.insecure, cfg.nats_tls)
        secrets, new = self.auth.child_env(Identity(args[0], name))
        if new and self.nats is not None:
            self.nats.reload()
        env = {
            **os.environ,
            "KVSTACK_NATS": self.nats_url,
            "PYTHONUNBUFFERED": "1",
            **secrets,
            **(env or {}),
        }
        with self._lock:
            process = Process.launch(name, args, env, self._log_path(name))
            self.processes.append(process)
        return process

    def process(self, name: str) -> Process:
        """The live child called `name` (after a restart, its new process)."""
        return next(p for p in self.processes if p.name == name)

    def restarts(self, name: str) -> int:
        """How often the supervisor restarted `name` (nats-server included)."""
        return self.supervisor.restarts[name] if self.supervisor is not None else 0

    @property
    def api_key_file(self) -> Path | None:
        """The file of the key the gateway requires (None: it requires none)."""
        return self.auth.api_key_file if self.auth is not None else None

    @property
    def api_key(self) -> str:
        """The key the gateway requires, for clients ("": none)."""
        path = self.api_key_file
        return read_api_key(path) if path is not None else ""

    @property
    def data_token(self) -> str | None:
        """The data plane's secret, for a stand-in worker in tests and benches (None:
        insecure)."""
        if self.auth is None or self.auth.secrets is None:
            return None
        return read_data_token(self.auth.secrets.data_token_path)

    async def bus(self, name: str, connect_timeout: float = 5.0) -> Bus:
        """A control-bus client with the admin's credentials (for checks and tools)."""
        return await Bus.connect(self.nats_url, name, self._admin(), connect_timeout)

    def _admin(self) -> NatsAuth:
        """The admin's credentials, for the stack's own checks (once started)."""
        if self.auth is None:
            raise KvstackError("the stack has no credentials before start()")
        return self.auth.admin()

    def restart_nats(self) -> None:
        """Stop the local nats-server and start it again on the same port and store (a
        cluster's nodes one after the other)."""
        if self.nats is None:
            raise KvstackError("this stack uses a NATS server it did not start")
        with self._lock:
            self.nats.restart()

    def wait_ready(self) -> None:
        """Until every service beats and the gateway answers /health; raises on a crash
        (supervised: once the supervisor gave up on a child)."""
        deadline = time.monotonic() + self.config.ready_timeout
        expected = Counter(p.service for p in self.processes)
        asyncio.run(self._await_heartbeats(expected, deadline))
        if self.config.with_gateway:
            self._await_gateway(max(deadline, time.monotonic() + 30))

    async def _await_heartbeats(self, expected: Counter, deadline: float) -> None:
        import nats

        seen: dict[str, str] = {}  # worker id -> service
        nc = await nats.connect(
            server_urls(self.nats_url),
            error_cb=_quiet,
            max_reconnect_attempts=-1,
            **self._admin().connect_options(),
        )

        async def on_beat(msg) -> None:
            beat = codec.decode(msg.data, Heartbeat)
            seen[beat.worker_id] = beat.service

        await nc.subscribe(subjects.all_heartbeats(), cb=on_beat)
        try:
            await self._until_seen(expected, seen, deadline)
        finally:
            await nc.close()

    async def _until_seen(self, expected: Counter, seen: dict[str, str], deadline: float) -> None:
        began, restarts = time.monotonic(), self._total_restarts()
        next_report = began + PROGRESS_EVERY
        while waiting := self._not_ready(expected, seen):
            self.check_alive()
            if restarts != self._total_restarts():  # a restarted child must beat anew
                seen.clear()
                restarts = self._total_restarts()
            now = time.monotonic()
            if now > deadline:
                raise KvstackError(
                    f"not ready within {self.config.ready_timeout:.0f}s: "
                    f"waiting for {', '.join(waiting)}"
                )
            if now >= next_report:
                say(f"waiting for {', '.join(waiting)} ({now - began:.0f}s)")
                next_report += PROGRESS_EVERY
            await asyncio.sleep(0.2)

    def _not_ready(self, expected: Counter, seen: dict[str, str]) -> list[str]:
        """Who is not ready: a child not running (restarting), or one not heard from yet
        (by name where its name is its worker id, else by service)."""
        missing = expected - Counter(seen.values())
        names = [
            p.name
            for p in self.processes
            if p.popen.poll() is not None or (p.service in missing and p.name not in seen)
        ]
        return names or sorted(missing)

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
        if self.supervisor is not None:
            if self.supervisor.failure is not None:
                raise self.supervisor.failure
            return
        for process in self.processes:
            code = process.popen.poll()
            if code is not None:
                raise KvstackError(
                    f"{process.name} exited with code {code}; its log "
                    f"({process.log_path}) ends with:\n{tail(process.log_path)}"
                )

    def stop(self) -> None:
        """Drain and stop, one tier after the other (`stack_process.STOP_TIERS`): each gets
        SIGTERM and its drain timeout to exit, then SIGKILL (SIGCONT too, should it be
        stopped); nats-server last. Nothing restarts now. Raises if any child's process
        group still has a live member after that."""
        self._hold()
        for tier in stop_tiers(self.processes):
            stack_process.terminate(tier, self.config.drain_timeout + STOP_GRACE)
        left = stack_process.sweep(self.processes)
        if self.nats is not None:
            self.nats.stop()
        if self.auth is not None:
            self.auth.close()
        self.metrics.close()
        if self.supervisor is not None:  # after every child it may have started ended
            self.supervisor.close()
        if left:
            raise KvstackError(f"these services did not stop, even when killed: {'; '.join(left)}")

    def kill(self) -> None:
        """The forced stop: SIGKILL every child's process group, then nats-server, at once
        and without waiting (so a signal handler may call it, also amid stop()); stop()
        then reaps them and cleans up."""
        self._hold()
        for process in self.processes:
            kill_group(process.popen)
        if self.nats is not None:
            self.nats.kill()

    def _hold(self) -> None:
        with self._lock:
            if self.supervisor is not None:
                self.supervisor.hold()

    def _children(self) -> list[Child]:
        return [*self.nats_nodes, *self.processes]

    @property
    def nats_nodes(self) -> list[NatsServer]:
        """The nats-servers this stack started (none with `nats_url`)."""
        if isinstance(self.nats, NatsCluster):
            return self.nats.nodes
        return [self.nats] if self.nats is not None else []

    def _total_restarts(self) -> int:
        return self.supervisor.restarts.total() if self.supervisor is not None else 0

    def _log_path(self, name: str) -> Path:
        """`name`'s log; the first time in this stack, last run's log moves to name.log.1."""
        path = self.config.log_dir / f"{name}.log"
        if name not in self._logs_begun:
            self._logs_begun.add(name)
            rotate(path)
        return path


def say(message: str) -> None:
    """What `kvstack up` (and a stack under test) tells its user, on stderr."""
    print(f"kvstack: {message}", file=sys.stderr, flush=True)


def engine_args(mock: MockSpec | None) -> list[str]:
    """The engine flags of workers and gateway (`kvstack prefill --engine ...`)."""
    if mock is None:
        return []
    return flags(
        engine="mock",
        mock_model=mock.model,
        mock_hardware=mock.hardware,
        mock_kv_scale=repr(mock.kv_scale),
    )


async def _quiet(e: Exception) -> None:
    pass


def _http_port(args: list[str]) -> int:
    """The --http-port a child's command line gives (0: none, a free port)."""
    flag = flags(http_port=1)[0]
    return int(args[args.index(flag) + 1]) if flag in args else 0
