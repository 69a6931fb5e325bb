"""A NATS cluster's generated config (routes to every other node, authenticated with the
deployment's own route password) and, against real nats-server nodes, that the routes
form with that password and not without it; `--nats` URL lists are checked at the door."""

from __future__ import annotations

import asyncio
import stat

import pytest

from shared.auth.cluster_config import ClusterNode, loopback_nodes, node_config
from shared.auth.deployment import COMPOSE_CLUSTER_CONFIG, Identity, ensure_secrets
from shared.auth.routes import ROUTE_SECRET, RouteCredentials, ensure_route_credentials
from shared.errors import KvstackError
from shared.runtime.bus import server_urls
from shared.runtime.nats_cluster import NatsCluster, routes_all
from shared.runtime.nats_server import NatsServer


def test_each_node_routes_to_every_other_with_the_route_password(tmp_path) -> None:
    routes = ensure_route_credentials(tmp_path)
    nodes = loopback_nodes([7001, 7002, 7003])
    config = node_config(nodes[1], routes, "../secrets/nats-auth.conf", tmp_path / "tls")
    prefix = f"nats-route://kvstack-route:{routes.password}@127.0.0.1"
    assert f'"{prefix}:7001"' in config and f'"{prefix}:7003"' in config
    assert ':7002"' not in config.split('"routes"')[1].split("]")[0]  # not to itself
    assert '"listen": "127.0.0.1:7002"' in config
    assert f'"password": "{routes.password}"' in config
    assert 'include "../secrets/nats-auth.conf"' in config
    assert 'server_name: "kvstack-nats-1"' in config
    assert f'"ca_file": "{tmp_path / "tls" / "ca.pem"}"' in config  # TLS on routes too


def test_route_passwords_are_made_per_deployment_kept_private_and_rotated(tmp_path) -> None:
    first = ensure_secrets(tmp_path / "a", [Identity("gateway")])
    second = ensure_secrets(tmp_path / "b", [Identity("gateway")])
    assert first.routes.password != second.routes.password
    assert len(first.routes.password) >= 40
    assert stat.S_IMODE((first.dir / ROUTE_SECRET).stat().st_mode) == 0o600
    made = first.routes
    assert ensure_secrets(first.dir, []).routes == made  # kept across runs
    rotated = ensure_secrets(first.dir, [], rotate=True).routes
    assert rotated != made
    compose = (first.dir / COMPOSE_CLUSTER_CONFIG).read_text()
    assert f"kvstack-route:{rotated.password}@nats-2:6222" in compose
    assert 'include "nats-auth.conf"' in compose and "server_name" not in compose
    assert "password=..." in repr(first.routes)


def test_insecure_routes_carry_no_credentials() -> None:
    config = node_config(ClusterNode("127.0.0.1:7001", ("127.0.0.1:7002",)), None)
    assert '"nats-route://127.0.0.1:7002"' in config and "authorization" not in config


def test_nodes_route_with_the_password_and_refuse_a_wrong_one(tmp_path) -> None:
    secrets = ensure_secrets(tmp_path / "secrets", [])
    cluster = NatsCluster(3, tmp_path, secrets.server_config, secrets.routes)
    try:
        cluster.wait_routed(secrets.auth(Identity("admin")), timeout=10)
        intruder = _intruder(tmp_path, cluster, RouteCredentials("kvstack-route", "guess"))
        try:
            urls = [cluster.urls[0], intruder.url]
            assert not asyncio.run(routes_all(urls, secrets.auth(Identity("admin")), 1.5))
        finally:
            intruder.stop()
    finally:
        cluster.stop()


def _intruder(tmp_path, cluster: NatsCluster, routes: RouteCredentials) -> NatsServer:
    """A node with the cluster's users but a guessed route password, routed to node 0."""
    node_0 = (cluster.workdir / "node-0" / "nats-server.conf").read_text()
    listen = node_0.split('"listen": "')[1].split('"')[0]
    node = ClusterNode("127.0.0.1:-1", (listen,), "intruder")
    workdir = tmp_path / "intruder"
    workdir.mkdir()
    config = workdir / "nats.conf"
    config.write_text(node_config(node, routes, "../secrets/nats-auth.conf"))
    return NatsServer(workdir, jetstream=False, config=config)


def test_a_url_list_is_split_and_bad_urls_are_refused_with_the_url() -> None:
    assert server_urls("nats://a:4222, tls://b:4223,") == ["nats://a:4222", "tls://b:4223"]
    assert server_urls("localhost:4222") == ["localhost:4222"]
    for bad in ("", " , ", "http://a:4222", "nats://a:port", "nats://:4222"):
        with pytest.raises(KvstackError, match="NATS server URL"):
            server_urls(bad)


def test_a_cluster_of_one_is_refused() -> None:
    with pytest.raises(KvstackError, match="2 nodes or more"):
        NatsCluster(1, log_dir=None)  # type: ignore[arg-type]
