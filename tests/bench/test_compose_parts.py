"""The parts of the container suite that need no Docker engine: the delaying relay (real
sockets, a real process), the partition's rules, the faults' names and the override the
suite lays over compose.yaml."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from bench.compose.faults import Fault
from bench.compose.network import Partition
from bench.compose.stack import COMPOSE_FILE, TEST_FLAGS, ComposeStack
from services.cli.main import build_parser

RELAY = Path(__file__).resolve().parents[2] / "bench" / "compose" / "relay.py"


def echo_server() -> tuple[socket.socket, int]:
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            while data := conn.recv(1 << 16):
                conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    return server, server.getsockname()[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_relay_delays_each_direction_and_keeps_the_stream_whole() -> None:
    server, upstream = echo_server()
    port = free_port()
    argv = [sys.executable, str(RELAY), "--listen", f"127.0.0.1:{port}"]
    argv += ["--upstream", f"127.0.0.1:{upstream}", "--delay-ms", "100"]
    relay = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert relay.stdout.readline().strip() == "listening"
        payload = os.urandom(1 << 20)
        with socket.create_connection(("127.0.0.1", port)) as conn:
            began = time.monotonic()
            conn.sendall(b"x")
            assert conn.recv(1) == b"x"
            round_trip = time.monotonic() - began
            threading.Thread(target=conn.sendall, args=(payload,), daemon=True).start()
            echoed = bytearray()
            while len(echoed) < len(payload):
                echoed += conn.recv(1 << 16)
        assert 0.2 <= round_trip < 1.0  # 100 ms out and 100 ms back
        assert bytes(echoed) == payload
    finally:
        relay.terminate()
        assert relay.wait(10) == 0
        server.close()


def test_a_partition_drops_both_ways_from_everyone_or_from_its_peers_only() -> None:
    everyone = Partition("p", ("10.0.0.5",))
    assert everyone.rules() == [["-s", "10.0.0.5"], ["-d", "10.0.0.5"]]
    peers = Partition("p", ("10.0.0.5",), ("10.0.0.9",))
    assert peers.rules() == [
        ["-s", "10.0.0.5", "-d", "10.0.0.9"],
        ["-s", "10.0.0.9", "-d", "10.0.0.5"],
    ]


@pytest.mark.parametrize("spec", ["explode:decode", "kill:", "kill"])
def test_a_fault_is_action_colon_service(spec) -> None:
    with pytest.raises(ValueError, match="ACTION:SERVICE"):
        Fault.parse(spec)
    assert Fault.parse("pause:decode", 5) == Fault("pause:decode", "pause", "decode", 5)


def test_the_suites_override_adds_flags_each_command_takes(tmp_path) -> None:
    stack = ComposeStack.prepare(tmp_path, scale={"decode": 2})
    compose = yaml.safe_load(COMPOSE_FILE.read_text())["services"]
    override = yaml.safe_load(stack.override_file.read_text())["services"]
    for name, flags in TEST_FLAGS.items():
        command = override[name]["command"]
        assert command[: len(compose[name]["command"])] == compose[name]["command"]
        build_parser().parse_args(command[1:])  # every flag is one the command takes
        assert command[-len(flags) :] == list(flags)
    assert override["nats"]["ports"] == [f"127.0.0.1:{stack.nats_port}:4222"]
    assert (stack.secrets_dir / "api-key").is_file()
