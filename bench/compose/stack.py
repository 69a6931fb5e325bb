"""One compose project of kvstack: compose.yaml as shipped plus an override of the test's
own (float32 so answers compare with the reference engine, small KV caches, short drains,
loopback ports), started, inspected and taken down to nothing.

    stack = ComposeStack.prepare(workdir, scale={"prefill": 2, "decode": 2})
    stack.up()            # `kvstack auth init` secrets, compose up -d, until /ready
    stack.containers("decode")
    stack.down()          # down -v: no container, network or volume left
"""

from __future__ import annotations

import os
import time
import urllib.request
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bench.compose.docker import compose_command, inspect, run
from services.cli.main import main as kvstack
from shared.auth.credentials import NatsAuth
from shared.auth.deployment import ADMIN, Identity, Secrets, read_api_key
from shared.errors import KvstackError
from shared.runtime.nats_cluster import free_ports

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "compose.yaml"
# float32 everywhere, so each answer can be compared with the reference engine's exactly
WORKER_FLAGS = ("--dtype", "float32", "--threads", "1", "--kv-cache-gib", "0.25")
TEST_FLAGS = {
    "conductor": ("--drain-timeout", "10"),
    "prefill": (*WORKER_FLAGS, "--drain-timeout", "10"),
    "decode": (*WORKER_FLAGS, "--drain-timeout", "10"),
    "decode-offload": (*WORKER_FLAGS, "--drain-timeout", "10"),
    "attention-worker": ("--threads", "1", "--kv-cache-gib", "0.25", "--drain-timeout", "10"),
    "kvstore": ("--dram-gib", "0.5", "--disk-gib", "1", "--drain-timeout", "10"),
    # long enough for a decode worker to come back when none is left
    "gateway": ("--dtype", "float32", "--placement-wait", "60", "--drain-timeout", "10"),
}
READY_TIMEOUT = 420.0
CLUSTER_URLS = "nats://nats-1:4222,nats://nats-2:4222,nats://nats-3:4222"


@dataclass(frozen=True)
class Container:
    id: str
    name: str
    service: str
    ip: str  # on the project's network
    state: str  # running, exited, paused, restarting, ...
    health: str  # healthy, unhealthy, starting, or "" (no health check)
    pid: int  # its init process, as this host sees it (0: not running)
    restarts: int

    @property
    def hostname(self) -> str:
        """Its host name inside (compose leaves it the container's short id)."""
        return self.id[:12]


@dataclass
class ComposeStack:
    project: str
    workdir: Path
    http_port: int
    nats_port: int
    scale: dict[str, int] = field(default_factory=dict)
    profiles: tuple[str, ...] = ()
    prometheus_port: int = 0  # prepare picks one; 0: Docker does

    @classmethod
    def prepare(
        cls,
        workdir: Path,
        scale: dict[str, int] | None = None,
        profiles: Iterable[str] = (),
        http_port: int = 0,
        nats_port: int = 0,
    ) -> ComposeStack:
        """Secrets and the override file in `workdir`; nothing started yet."""
        workdir.mkdir(parents=True, exist_ok=True)
        picked = free_ports(3)  # NOTE: all at once: one by one, two could be the same port
        stack = cls(
            f"kvstack-test-{uuid.uuid4().hex[:8]}",
            workdir,
            http_port or picked[0],
            nats_port or picked[1],
            dict(scale or {}),
            tuple(profiles),
            picked[2],
        )
        if kvstack(["auth", "init", "--dir", str(stack.secrets_dir)]) != 0:
            raise KvstackError("kvstack auth init failed")
        stack.override_file.write_text(yaml.safe_dump(stack.override()))
        return stack

    @property
    def secrets_dir(self) -> Path:
        return self.workdir / "secrets"

    @property
    def override_file(self) -> Path:
        return self.workdir / "compose.test.yaml"

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def nats_url(self) -> str:
        return f"nats://127.0.0.1:{self.nats_port}"

    @property
    def api_key(self) -> str:
        return read_api_key(self.secrets_dir / "api-key")

    def admin(self) -> NatsAuth:
        """Credentials that may ask any service for its stats (the published NATS port)."""
        return Secrets(self.secrets_dir).auth(Identity(ADMIN))

    @property
    def network(self) -> str:
        return f"{self.project}_default"

    def override(self) -> dict:
        """compose.yaml's kvstack commands with the test's flags after them (the last of a
        repeated flag wins), and NATS published on loopback for the test's checks."""
        services = yaml.safe_load(COMPOSE_FILE.read_text())["services"]
        override: dict = {
            name: {"command": [*services[name]["command"], *flags]}
            for name, flags in TEST_FLAGS.items()
        }
        override[self.nats_service] = {"ports": [f"127.0.0.1:{self.nats_port}:4222"]}
        return {"services": override}

    @property
    def clustered(self) -> bool:
        """NATS as compose's 3-node cluster (the nats-cluster profile)."""
        return "nats-cluster" in self.profiles

    @property
    def nats_service(self) -> str:
        """The NATS service the test's own clients reach on `nats_port`."""
        return "nats-1" if self.clustered else "nats"

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "KVSTACK_SECRETS": str(self.secrets_dir.resolve()),
            "KVSTACK_HTTP_ADDR": f"127.0.0.1:{self.http_port}",
            "KVSTACK_PROMETHEUS_ADDR": f"127.0.0.1:{self.prometheus_port}",
            **({"KVSTACK_NATS": CLUSTER_URLS} if self.clustered else {}),
        }

    def compose(self, *args: str, timeout: float = 600, check: bool = True):
        files = ["-f", str(COMPOSE_FILE), "-f", str(self.override_file)]
        profiles = [word for p in self.profiles for word in ("--profile", p)]
        argv = [*compose_command(), "-p", self.project, *files, *profiles, *args]
        return run(argv, timeout=timeout, env=self.env(), check=check)

    def up(self, timeout: float = READY_TIMEOUT) -> None:
        """Start every service (at its scale) and wait until each is healthy and the
        gateway is ready; a clear error, with the logs' tails, otherwise."""
        scale = [word for s, n in self.scale.items() for word in ("--scale", f"{s}={n}")]
        self.compose("up", "-d", "--no-build", *scale, timeout=timeout)
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float = READY_TIMEOUT, gone: Iterable[str] = ()) -> float:
        """Seconds until every running container is healthy and the gateway's /ready says
        200; containers named in `gone` (stopped on purpose) are not waited for."""
        began, skip = time.monotonic(), set(gone)
        while True:
            waiting = [
                c.name
                for c in self.containers()
                if c.name not in skip and c.health not in ("healthy", "")
            ]
            if not waiting and self.gateway_ready():
                return time.monotonic() - began
            if time.monotonic() - began > timeout:
                raise KvstackError(
                    f"the compose stack was not ready within {timeout:.0f}s: waiting for "
                    f"{', '.join(waiting) or 'the gateway /ready'}\n{self.logs(40)}"
                )
            time.sleep(1.0)

    def gateway_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.api_url}/ready", timeout=3) as response:
                return response.status == 200
        except OSError:
            return False

    def containers(self, service: str = "") -> list[Container]:
        """The project's containers (of one service), by name."""
        labels = [f"label=com.docker.compose.project={self.project}"]
        if service:
            labels.append(f"label=com.docker.compose.service={service}")
        filters = [word for label in labels for word in ("--filter", label)]
        ids = run(["docker", "ps", "-a", "-q", *filters]).stdout.split()
        found = [self._container(info) for info in inspect(ids)]
        return sorted(found, key=lambda c: c.name)

    def _container(self, info: dict) -> Container:
        state = info["State"]
        network = info["NetworkSettings"]["Networks"].get(self.network) or {}
        return Container(
            info["Id"],
            info["Name"].lstrip("/"),
            info["Config"]["Labels"]["com.docker.compose.service"],
            network.get("IPAddress", ""),
            state["Status"],
            (state.get("Health") or {}).get("Status", ""),
            state.get("Pid", 0),
            info.get("RestartCount", 0),
        )

    def container(self, name: str) -> Container:
        [found] = [c for c in self.containers() if c.name == name]
        return found

    def logs(self, tail: int = 200) -> str:
        done = self.compose("logs", "--no-color", "--tail", str(tail), check=False)
        return done.stdout[-20000:]

    def save_logs(self, tail: int = 5000) -> Path:
        """Each container's log (its last `tail` lines) in workdir/logs/NAME.log."""
        folder = self.workdir / "logs"
        folder.mkdir(exist_ok=True)
        for c in self.containers():
            done = run(["docker", "logs", "--tail", str(tail), c.id], check=False)
            (folder / f"{c.name}.log").write_text(done.stdout + done.stderr)
        return folder

    def down(self) -> None:
        """Stop and remove every container, the network and the volumes."""
        self.compose("down", "-v", "--remove-orphans", "--timeout", "20", timeout=300)

    def leftovers(self) -> list[str]:
        """Whatever of this project Docker still holds: containers, networks, volumes."""
        label = f"label=com.docker.compose.project={self.project}"
        found = run(["docker", "ps", "-a", "-q", "--filter", label]).stdout.split()
        for kind in ("network", "volume"):
            found += run(["docker", kind, "ls", "-q", "--filter", label]).stdout.split()
        return found
