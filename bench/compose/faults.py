"""The faults of a compose chaos run, each on one container (or link) of the stack:

    kill        SIGKILL to the container's init from this host, as the OOM killer or a
                crash would: compose's restart policy starts it again
    docker-kill `docker kill` (SIGKILL through the engine), then `docker start`: on Docker
                20.10 a `docker kill` counts as a manual stop, which the restart policy
                leaves down
    stop        `docker stop` (SIGTERM, then the drain; compose's scale-down), then start
    partition   the container cut off from every other one for `hold` seconds
    nats-cut    the container cut off from NATS alone for `hold` seconds
    pause       `docker pause` (frozen) for `hold` seconds, then unpause
    slow-link   every prefill's KV to every decode through a relay: 20 ms each way, 1%
                loss, 200 Mbit/s (the prefills restart first, so their connections go
                through it); taken away at the end of the phase

A worker's fault hits the one holding the most requests (so the fault lands on work in
flight); `nats-node` the node of the nats-cluster profile with the most clients; any other
the service's first container.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass

from bench.compose.docker import kill, run
from bench.compose.network import Partition, SlowLink
from bench.compose.stack import ComposeStack, Container
from shared import subjects
from shared.messages import Heartbeat, StatsRequest, WorkerStats
from shared.runtime.bus import Bus

ACTIONS = ("kill", "docker-kill", "stop", "partition", "nats-cut", "pause", "slow-link")
WORKERS = ("prefill", "decode")
NATS_NODE = "nats-node"  # a fault's service: the busiest node of the nats-cluster profile
CLUSTER_NODES = ("nats-1", "nats-2", "nats-3")
RELAY_PORT = 9390
DOWN_AFTER_DOCKER_KILL_S = 5.0
PREFER_SEVERAL_S = 10.0  # how long to wait for a worker holding two requests or more


@dataclass(frozen=True)
class LinkShape:
    """What a slow link does to the bytes on it."""

    delay_ms: float = 20.0  # each way
    loss: float = 0.01  # of the packets, each way
    rate: str = "200mbit"  # tc's notation


@dataclass(frozen=True)
class Fault:
    name: str  # what the table calls it
    action: str
    service: str
    hold: float = 20.0  # seconds a partition or a pause lasts
    link: LinkShape = LinkShape()  # a slow link's

    @classmethod
    def parse(cls, spec: str, hold: float = 20.0, link: LinkShape = LinkShape()) -> Fault:
        """ACTION:SERVICE, e.g. kill:decode, partition:decode, nats-cut:gateway."""
        action, _, service = spec.partition(":")
        if action not in ACTIONS or not service:
            raise ValueError(f"fault {spec!r}: ACTION:SERVICE with ACTION one of {ACTIONS}")
        return cls(spec, action, service, hold, link)


@dataclass
class Injected:
    """What a fault did, for undoing it and for the report."""

    victim: Container
    victim_load: int  # requests the victim held when hit (-1: not a worker)
    undo: list  # callables, run in order by `heal`


def victim(stack: ComposeStack, service: str, timeout: float = 30) -> tuple[Container, int]:
    """The container to hit, and how many requests it held (-1 unless a worker): for a
    worker, the first time one is seen holding any within `timeout`, the busiest."""
    if service == NATS_NODE:
        return _busiest_nats_node(stack), -1
    running = [c for c in stack.containers(service) if c.state == "running"]
    if not running:
        raise RuntimeError(f"no running {service} container to hit")
    if service not in WORKERS:
        return running[0], -1
    return asyncio.run(_busiest(stack, service, running, timeout))


def _busiest_nats_node(stack: ComposeStack) -> Container:
    """The node of the nats-cluster profile with the most client connections."""
    nodes = [c for c in stack.containers() if c.service in CLUSTER_NODES and c.state == "running"]
    if not nodes:
        raise RuntimeError("no nats-cluster node runs (the nats-cluster profile is off)")
    return max(nodes, key=_connections)


def _connections(node: Container) -> int:
    """A nats-server's client connections, from its monitoring endpoint (inside)."""
    ask = "import json, urllib.request as u; print(json.load(u.urlopen(%r))['connections'])"
    argv = ["docker", "exec", node.id, "python3", "-c", ask % "http://127.0.0.1:8222/varz"]
    return int(run(argv, timeout=30).stdout.strip() or 0)


def inject(stack: ComposeStack, fault: Fault) -> Injected:
    hit, load = victim(stack, fault.service)
    injected = Injected(hit, load, [])
    match fault.action:
        case "kill":
            os.kill(hit.pid, signal.SIGKILL)
        case "docker-kill":
            kill(hit.id)
            time.sleep(DOWN_AFTER_DOCKER_KILL_S)  # its requests move on meanwhile
            injected.undo.append(lambda: run(["docker", "start", hit.id]))
        case "stop":
            run(["docker", "stop", "-t", "45", hit.id], timeout=120)
            injected.undo.append(lambda: run(["docker", "start", hit.id]))
        case "partition" | "nats-cut":
            peers = (_nats_ips(stack)) if fault.action == "nats-cut" else ()
            cut = Partition(stack.project, (hit.ip,), peers)
            cut.apply()
            time.sleep(fault.hold)
            cut.heal()
        case "pause":
            run(["docker", "pause", hit.id])
            time.sleep(fault.hold)
            run(["docker", "unpause", hit.id])
        case "slow-link":
            injected.undo += _slow_links(stack, fault.link)
    return injected


def heal(injected: Injected) -> None:
    for undo in injected.undo:
        undo()


def _nats_ips(stack: ComposeStack) -> tuple[str, ...]:
    return tuple(c.ip for c in stack.containers() if c.service.startswith("nats") and c.ip)


def _slow_links(stack: ComposeStack, shape: LinkShape) -> list:
    """Restart every prefill, put a slow link from each to each decode before it serves,
    and return how to take them away."""
    decodes = [c for c in stack.containers("decode") if c.state == "running"]
    undo = []
    for prefill in stack.containers("prefill"):
        run(["docker", "restart", "-t", "20", prefill.id], timeout=120)
        pid = _pid_once_running(prefill.id)
        for i, decode in enumerate(decodes):
            upstream, port = f"{decode.ip}:9200", RELAY_PORT + i
            link = SlowLink(pid, upstream, port, shape.delay_ms, shape.loss, shape.rate)
            relay = link.apply()
            undo.append(lambda link=link, relay=relay: link.remove(relay))
    return undo


def _pid_once_running(container_id: str, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = run(["docker", "inspect", "-f", "{{.State.Pid}}", container_id]).stdout.strip()
        if pid and pid != "0":
            return int(pid)
        time.sleep(0.1)
    raise RuntimeError(f"{container_id[:12]} did not start again")


async def _busiest(
    stack: ComposeStack, service: str, running: list[Container], timeout: float
) -> tuple[Container, int]:
    """The container holding the most requests, asked over NATS until one holds several
    (or, after PREFER_SEVERAL_S, any): a lone request can end between the answer and the
    hit, and then the fault lands on nothing."""
    bus = await Bus.connect(stack.nats_url, "compose-chaos", stack.admin(), 5.0)
    try:
        ids = await _worker_ids(bus, service, running)
        began = time.monotonic()
        while True:
            loads = await _loads(bus, service, ids)
            chosen = max(running, key=lambda c: loads.get(c.id, 0))
            load, waited = loads.get(chosen.id, 0), time.monotonic() - began
            if load >= 2 or (load and waited > PREFER_SEVERAL_S) or waited > timeout:
                return chosen, load
    finally:
        await bus.nc.close()


async def _loads(bus: Bus, service: str, ids: dict[str, str]) -> dict[str, int]:
    """Requests each container holds (waiting or running), by container id."""
    asked = [
        bus.request(subjects.worker_stats(service, w), StatsRequest(), 5.0, expected=WorkerStats)
        for w in ids.values()
    ]
    stats = await asyncio.gather(*asked, return_exceptions=True)
    return {
        c: s.num_running + s.num_waiting for c, s in zip(ids, stats) if isinstance(s, WorkerStats)
    }


async def _worker_ids(bus: Bus, service: str, running: list[Container]) -> dict[str, str]:
    """Each container's worker id, from the heartbeats (a worker's default id names its
    host: <service>-<container's short id>-<pid>)."""
    found: dict[str, str] = {}

    async def on_beat(beat: Heartbeat) -> None:
        for c in running:
            if beat.worker_id.startswith(f"{service}-{c.hostname}-") and not beat.stopped:
                found[c.id] = beat.worker_id

    sub = await bus.subscribe(subjects.all_heartbeats(), on_beat, expected=Heartbeat)
    deadline = time.monotonic() + 10
    while len(found) < len(running) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    await sub.unsubscribe()
    return found
