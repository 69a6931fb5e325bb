"""The config of one nats-server node of a cluster: its cluster block (listen address,
routes to the other nodes, the routes' credentials and, with TLS, the deployment's
certificates on routes too), and the deployment's users and permissions by `include`.

Every node of `kvstack up --nats-cluster N` gets one on loopback; `kvstack auth init`
writes one for compose (`nats-cluster.conf`, routes to the compose service names).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from shared.auth.routes import RouteCredentials

CLUSTER_NAME = "kvstack"
ROUTE_AUTH_TIMEOUT = 2  # seconds a route has to authenticate
ROUTE_TLS_TIMEOUT = 5  # seconds for a route's TLS handshake


@dataclass(frozen=True)
class ClusterNode:
    listen: str  # host:port this node accepts routes on
    peers: tuple[str, ...]  # host:port of every other node's route listener
    server_name: str = ""  # "": given on the command line (-n), as compose does


def route_url(peer: str, routes: RouteCredentials | None) -> str:
    if routes is None:
        return f"nats-route://{peer}"
    return f"nats-route://{routes.user}:{routes.password}@{peer}"


def node_config(
    node: ClusterNode,
    routes: RouteCredentials | None,
    include: str | None = None,
    tls_dir: Path | str | None = None,
) -> str:
    """nats-server's config text for `node` (JSON values, all quoted). `routes` None (only
    with --insecure) leaves routes unauthenticated; `include` is the users' config, a
    path relative to this file's directory (nats-server reads includes only so)."""
    cluster: dict = {
        "name": CLUSTER_NAME,
        "listen": node.listen,
        "routes": [route_url(peer, routes) for peer in node.peers],
    }
    if routes is not None:
        cluster["authorization"] = {
            "user": routes.user,
            "password": routes.password,
            "timeout": ROUTE_AUTH_TIMEOUT,
        }
    if tls_dir is not None:
        cluster["tls"] = _route_tls(Path(tls_dir))
    text = "# Written by kvstack; edits are overwritten.\n"
    if node.server_name:
        text += f"server_name: {json.dumps(node.server_name)}\n"
    if include is not None:
        text += f"include {json.dumps(include)}\n"
    return text + f"cluster: {json.dumps(cluster, indent=1)}\n"


def loopback_nodes(route_ports: Sequence[int]) -> list[ClusterNode]:
    """The nodes of a cluster on this machine, each routed to every other."""
    addresses = [f"127.0.0.1:{port}" for port in route_ports]
    return [
        ClusterNode(own, tuple(a for a in addresses if a != own), f"kvstack-nats-{i}")
        for i, own in enumerate(addresses)
    ]


def _route_tls(tls_dir: Path) -> dict:
    # NOTE: the server certificate has no key-usage limits, so each node presents it both
    # when it accepts a route and when it dials one; peers verify it against the CA.
    return {
        "cert_file": str(tls_dir / "server.pem"),
        "key_file": str(tls_dir / "server-key.pem"),
        "ca_file": str(tls_dir / "ca.pem"),
        "timeout": ROUTE_TLS_TIMEOUT,
    }
