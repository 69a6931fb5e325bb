"""Faults between containers, made on this host (root) with what the kernel has here:
iptables (DOCKER-USER: partitions; `statistic`: random loss), tc's `tbf` (rate) and, for
delay (no `netem` qdisc), a delaying TCP relay. Every rule names only the test's own
containers' addresses and carries the project's name as a comment, so `clear` finds and
removes whatever a failed run left.

A partition drops packets in DOCKER-USER, the chain Docker consults first for traffic
between containers: addresses stay as they were (a `docker network disconnect` would give
the container another one on reconnection, and the address it advertised would be stale)
and connections see silence, as on a real cut, not an error.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.compose.docker import run

CHAIN = "DOCKER-USER"
CONTAINER_UID = 10001  # the image's kvstack user: its connections are the ones relayed


@dataclass(frozen=True)
class Partition:
    """Every packet between each of `ips` and each of `peers` (every address when `peers`
    is empty) dropped, both ways."""

    tag: str  # the project's name
    ips: tuple[str, ...]
    peers: tuple[str, ...] = ()

    def rules(self) -> list[list[str]]:
        if not self.peers:
            return [r for ip in self.ips for r in (["-s", ip], ["-d", ip])]
        return [
            r
            for ip in self.ips
            for p in self.peers
            for r in (["-s", ip, "-d", p], ["-s", p, "-d", ip])
        ]

    def apply(self) -> None:
        for rule in self.rules():
            run(["iptables", "-I", CHAIN, *rule, *self._target()])

    def heal(self) -> None:
        for rule in self.rules():
            run(["iptables", "-D", CHAIN, *rule, *self._target()], check=False)

    def _target(self) -> list[str]:
        return ["-m", "comment", "--comment", self.tag, "-j", "DROP"]


def owner(uid: int) -> list[str]:
    return ["-m", "owner", "--uid-owner", str(uid)]


def clear(tag: str) -> None:
    """Remove every rule of DOCKER-USER tagged `tag` (what a failed run left)."""
    listed = run(["iptables", "-S", CHAIN], check=False).stdout.splitlines()
    for line in listed:
        if f"--comment {tag}" in line and line.startswith("-A "):
            run(["iptables", "-D", *line.split()[1:]], check=False)


@dataclass(frozen=True)
class SlowLink:
    """The KV data plane from the container whose init is `pid` to `upstream` (ip:port)
    through a relay in its network namespace that delays each direction by `delay_ms`,
    with `loss` of the relay's packets dropped at random and the container's egress held
    to `rate` (tc tbf). Only connections the container opens after `apply` go through."""

    pid: int
    upstream: str
    relay_port: int
    delay_ms: float = 20.0
    loss: float = 0.01
    rate: str = "200mbit"

    def apply(self) -> subprocess.Popen:
        """The rules and the relay (running until the returned process is ended)."""
        ip, port = self.upstream.rsplit(":", 1)
        for rule in self._rules(ip, port):
            self._in_netns(["iptables", *rule])
        tbf = ["qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", self.rate]
        self._in_netns(["tc", *tbf, "burst", "256kb", "latency", "100ms"])
        return self._start_relay()

    def remove(self, relay: subprocess.Popen) -> None:
        ip, port = self.upstream.rsplit(":", 1)
        for rule in self._rules(ip, port):
            self._in_netns(["iptables", *["-D" if w == "-A" else w for w in rule]], check=False)
        self._in_netns(["tc", "qdisc", "del", "dev", "eth0", "root"], check=False)
        relay.terminate()
        try:
            relay.wait(10)
        except subprocess.TimeoutExpired:
            relay.kill()
            relay.wait(10)

    def _rules(self, ip: str, port: str) -> list[list[str]]:
        to_relay = ["-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-d", ip, "--dport", port]
        relayed = ["-m", "owner", "--uid-owner", str(CONTAINER_UID)]
        drop = [
            "-m",
            "statistic",
            "--mode",
            "random",
            "--probability",
            str(self.loss),
            "-j",
            "DROP",
        ]
        out = [
            "-A",
            "OUTPUT",
            "-p",
            "tcp",
            "-d",
            ip,
            "--dport",
            port,
            "-m",
            "owner",
            "--uid-owner",
            "0",
        ]
        back = ["-A", "INPUT", "-p", "tcp", "-s", ip, "--sport", port]
        redirect = [*to_relay, *relayed, "-j", "REDIRECT", "--to-ports", str(self.relay_port)]
        return [redirect, [*out, *drop], [*back, *drop]]

    def _in_netns(self, argv: Sequence[str], check: bool = True):
        return run(["nsenter", "-t", str(self.pid), "-n", *argv], check=check)

    def _start_relay(self) -> subprocess.Popen:
        relay = Path(__file__).with_name("relay.py")
        argv = [
            "nsenter", "-t", str(self.pid), "-n", sys.executable, str(relay),
            "--listen", f"127.0.0.1:{self.relay_port}", "--upstream", self.upstream,
            "--delay-ms", str(self.delay_ms),
        ]  # fmt: skip
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        if process.stdout is None or process.stdout.readline().strip() != "listening":
            process.kill()
            raise RuntimeError(f"the relay to {self.upstream} did not start")
        return process
