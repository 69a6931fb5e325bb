"""A NATS cluster on this machine: `size` nats-server nodes (shared/runtime/nats_server.py), each
routed to every other on loopback, for `kvstack up --nats-cluster N` and tests.

Each node keeps its client port and its route port across restarts, so clients holding
every node's URL (`url`: comma-separated, as KVSTACK_NATS takes it) and the other nodes'
routes find it again. Routes authenticate with the deployment's route credentials
(shared/auth/routes.py), and the users' config (`auth_config`) applies on every node.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from shared.auth.cluster_config import loopback_nodes, node_config
from shared.auth.credentials import NatsAuth, write_private
from shared.auth.routes import RouteCredentials
from shared.errors import KvstackError
from shared.runtime.nats_server import NatsServer

ROUTE_TIMEOUT = 15.0  # seconds for every node to route to every other at start
PROBE_WAIT = 0.2  # seconds a probe round waits for its messages


class NatsCluster:
    """`size` nodes, nats-server-0 .. nats-server-<size-1>; stop() ends them all."""

    def __init__(
        self,
        size: int,
        log_dir: Path,
        auth_config: Path | None = None,
        routes: RouteCredentials | None = None,
        tls_dir: Path | None = None,
    ) -> None:
        if size < 2:
            raise KvstackError(f"a NATS cluster needs 2 nodes or more (3 for a quorum), not {size}")
        if routes is None and auth_config is not None:
            raise KvstackError("a cluster with users needs route credentials too")
        self.workdir = Path(tempfile.mkdtemp(prefix="kvstack-nats-cluster-"))
        self.nodes: list[NatsServer] = []
        try:
            for i, node in enumerate(loopback_nodes(free_ports(size))):
                node_dir = self.workdir / f"node-{i}"
                config = node_dir / "nats-server.conf"
                include = os.path.relpath(auth_config, node_dir) if auth_config else None
                write_private(config, node_config(node, routes, include, tls_dir))
                log_path = log_dir / f"nats-server-{i}.log"
                self.nodes.append(NatsServer(node_dir, True, log_path, config, f"nats-server-{i}"))
        except BaseException:
            self.stop()
            raise

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    @property
    def url(self) -> str:
        """Every node's client URL, comma-separated (what --nats and KVSTACK_NATS take)."""
        return ",".join(self.urls)

    def reload(self) -> None:
        """Every node reads its config again (new users); clients stay connected."""
        self._each(NatsServer.reload)

    def restart(self) -> None:
        """Restart one node after the other: the cluster serves throughout."""
        self._each(NatsServer.restart)

    def kill(self) -> None:
        self._each(NatsServer.kill)

    def stop(self) -> None:
        self._each(NatsServer.stop)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def _each(self, action: Callable[[NatsServer], None]) -> None:
        for node in self.nodes:
            action(node)

    def wait_routed(self, auth: NatsAuth, timeout: float = ROUTE_TIMEOUT) -> None:
        """Until a message published on any running node reaches every running node."""
        live = [node.url for node in self.nodes if node.poll() is None]
        if not asyncio.run(routes_all(live, auth, timeout)):
            raise KvstackError(
                f"the NATS cluster's nodes did not route to each other within {timeout:.0f}s; "
                f"see {', '.join(str(n.log_path) for n in self.nodes)}"
            )


async def routes_all(urls: list[str], auth: NatsAuth, timeout: float) -> bool:
    """Whether, within `timeout`, one probe round reaches every node from every node (a
    client on each node, each subscribed to the same subject)."""
    import nats

    clients = [
        await nats.connect(url, allow_reconnect=False, connect_timeout=2, **auth.connect_options())
        for url in urls
    ]
    subject = f"kvstack.cluster-probe.{secrets.token_hex(8)}"
    heard: list[set[bytes]] = [set() for _ in clients]
    try:
        for nc, seen in zip(clients, heard, strict=True):
            await nc.subscribe(subject, cb=_collect(seen))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if await _probe_round(clients, subject, heard):
                return True
        return False
    finally:
        for nc in clients:
            await nc.close()


async def _probe_round(clients: list, subject: str, heard: list[set[bytes]]) -> bool:
    sent = {f"{secrets.token_hex(4)}-{i}".encode() for i in range(len(clients))}
    for nc, payload in zip(clients, sorted(sent), strict=True):
        await nc.publish(subject, payload)
        await nc.flush()
    await asyncio.sleep(PROBE_WAIT)
    return all(sent <= seen for seen in heard)


def _collect(seen: set[bytes]):
    async def on_msg(msg) -> None:
        seen.add(msg.data)

    return on_msg


def free_ports(count: int) -> list[int]:
    """Ports free now on loopback, all different (held open until every one is chosen)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()
