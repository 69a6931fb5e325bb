"""NATS as a cluster (`kvstack up --nats-cluster 3`): three real nats-server nodes routed on
loopback with the deployment's credentials, a real stack of mock workers on them, and one
node SIGKILLed under a steady load through the gateway: no request is lost, every answer
is whole and the same as before the fault, the two nodes left still route, and the node
restarted on its ports rejoins."""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from pathlib import Path

import pytest

from bench.chaos.load import Case, SteadyLoad
from services.stack.stack import Stack
from shared.engine.mock import MockSpec
from shared.runtime.nats_cluster import NatsCluster, routes_all
from tests.e2e.conftest import running_stack

SPEC = MockSpec("llama3-70b", "a800", 1e-3)
MAX_TOKENS = 24
PROMPTS = [tuple(range(100 + i, 160 + i)) for i in range(4)]


@pytest.fixture(scope="module")
def cluster_stack(tmp_path_factory, smollm2_dir):
    with running_stack(
        tmp_path_factory.mktemp("nats-cluster"),
        nats_cluster=3,
        mock=SPEC,
        worker_args=("--threads", "1", "--kv-cache-gib", "0.02"),
        gateway_args=(),
        drain_timeout=2.0,
    ) as stack:
        yield stack


def test_every_service_gets_every_node_and_the_routes_need_the_password(cluster_stack) -> None:
    cluster = cluster_stack.nats
    assert isinstance(cluster, NatsCluster) and len(cluster.nodes) == 3
    env = _environ(cluster_stack.process("gateway-0").popen.pid)
    assert env["KVSTACK_NATS"].split(",") == cluster.urls
    config = (cluster.workdir / "node-0" / "nats-server.conf").read_text()
    password = cluster_stack.auth.route_credentials().password
    assert f"kvstack-route:{password}@127.0.0.1:" in config
    assert config.count("nats-route://") == 2  # to each other node


def test_a_node_killed_under_load_loses_no_request(cluster_stack: Stack) -> None:
    cases = [Case(p, _answer(cluster_stack, p)) for p in PROMPTS]
    load = SteadyLoad(cluster_stack.api_url, "SmolLM2-135M-Instruct", cases, MAX_TOKENS, 3, 60.0)
    load.start()
    try:
        _wait_for_outcomes(load, 3)
        victim = _busiest_node(cluster_stack)
        killed_at = time.monotonic()
        victim.kill()
        assert victim.process is not None and victim.process.wait(10) is not None
        time.sleep(4.0)
    finally:
        load.stop()
    outcomes = load.outcomes
    lived_through = [o for o in outcomes if o.started < killed_at < o.ended]
    print(_summary(outcomes, lived_through, victim.name))  # docs/reliability.md (pytest -s)
    assert lived_through, "no request was in flight when the node died"
    assert [o.error for o in outcomes if not o.completed] == []
    assert all(o.text == cases[o.case].want for o in outcomes)
    assert any(o.started > killed_at + 1.0 for o in outcomes)  # served after, too
    left = [n.url for n in cluster_stack.nats.nodes if n.poll() is None]
    assert len(left) == 2
    assert asyncio.run(routes_all(left, cluster_stack.auth.admin(), 5.0))
    victim.restart()  # as `kvstack up`'s supervisor does: same ports, it rejoins
    cluster_stack.nats.wait_routed(cluster_stack.auth.admin(), timeout=10)


def _summary(outcomes, lived_through, victim: str) -> str:
    seconds = [round(o.ended - o.started, 2) for o in lived_through]
    return (
        f"\nkilled {victim}: {len(outcomes)} requests, "
        f"{sum(o.completed for o in outcomes)} complete; in flight at the kill: {seconds} s, "
        f"migrations {[o.migrations for o in lived_through]}; median of all "
        f"{statistics.median(o.ended - o.started for o in outcomes):.2f} s"
    )


def _answer(stack: Stack, prompt: tuple[int, ...]) -> str:
    """The stack's greedy answer before any fault (what every later one must equal)."""
    import openai

    client = openai.OpenAI(base_url=f"{stack.api_url}/v1", api_key="none", max_retries=0)
    result = client.completions.create(
        model="SmolLM2-135M-Instruct",
        prompt=list(prompt),
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert result.usage.completion_tokens == MAX_TOKENS
    return result.choices[0].text


def _wait_for_outcomes(load: SteadyLoad, count: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while len(load.outcomes) < count:
        assert time.monotonic() < deadline, "the load did not get going"
        time.sleep(0.1)


def _busiest_node(stack: Stack):
    """The node most services are connected to (the gateway's of those tied)."""
    children = ["gateway-0", "conductor-0", "prefill-0", "decode-0"]
    nodes = [_node_of(stack, child) for child in children]
    return max(nodes, key=lambda node: (nodes.count(node), node is nodes[0]))


def _node_of(stack: Stack, child: str):
    """The nats-server node `child` is connected to (from its sockets in /proc)."""
    ports = _remote_ports(stack.process(child).popen.pid)
    nodes = [n for n in stack.nats.nodes if n.port in ports]
    assert len(nodes) == 1, (ports, [n.port for n in stack.nats.nodes])
    return nodes[0]


def _remote_ports(pid: int) -> set[int]:
    """The remote ports of `pid`'s established TCP connections to 127.0.0.1."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd) if fd.is_symlink() else ""
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote, state, inode = fields[2], fields[3], fields[9]
        if inode in inodes and state == "01" and remote.startswith("0100007F:"):
            ports.add(int(remote.split(":")[1], 16))
    return ports


def _environ(pid: int) -> dict[str, str]:
    entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode().split("=", 1) for e in entries if b"=" in e)
