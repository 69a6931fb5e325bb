"""Fixed ports: `kvstack up` gives every service its documented HTTP port from the base
port, refuses at once when one is taken, and writes a Prometheus config that scrapes
exactly those ports."""

from __future__ import annotations

import json
import socket

import pytest

from services.cli.main import build_parser
from services.cli.up import stack_config
from services.stack import prometheus_config
from services.stack.ports import Listener, PortLayout, check_free
from services.stack.stack import Stack, StackConfig
from shared.errors import KvstackError


def shape(**config) -> Stack:
    return Stack(StackConfig(num_prefill=2, num_decode=2, num_kvstore=1, num_attention=1, **config))


def test_every_child_gets_its_port_from_the_base() -> None:
    commands = dict(shape(base_port=9000).commands())
    ports = {name: build_parser().parse_args(args).http_port for name, args in commands.items()}
    assert ports == {
        "conductor-0": 9001,
        "kvstore-0": 9010,
        "prefill-0": 9100,
        "prefill-1": 9101,
        "attention-0-0": 9300,
        "decode-0": 9200,
        "attention-1-0": 9301,
        "decode-1": 9201,
        "gateway-0": 8000,  # the API keeps --port
    }


def test_without_a_base_port_every_child_takes_a_free_port() -> None:
    commands = dict(shape().commands())
    assert all(build_parser().parse_args(args).http_port in (0, 8000) for args in commands.values())


def test_up_defaults_to_the_documented_base_and_0_turns_it_off() -> None:
    default = stack_config(build_parser().parse_args(["up"]))
    assert (default.base_port, default.metrics_port) == (8100, 8100)
    free = stack_config(build_parser().parse_args(["up", "--base-port", "0"]))
    assert (free.base_port, free.metrics_port) == (None, 0)
    moved = stack_config(build_parser().parse_args(["up", "--base-port", "7000"]))
    assert (moved.base_port, moved.metrics_port) == (7000, 7000)


def test_more_workers_than_slots_is_a_clear_error() -> None:
    with pytest.raises(KvstackError, match="fixed ports fit 100 prefill"):
        PortLayout(9000).port("prefill", 100)
    with pytest.raises(KvstackError, match="past port 65535"):
        PortLayout(65500).port("decode", 0)


def test_a_taken_port_is_named_with_who_wanted_it() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(KvstackError, match=rf"127.0.0.1:{port} \(prefill-0\).*--base-port"):
            check_free([Listener("prefill-0", "prefill", "127.0.0.1", port)])


def test_the_prometheus_config_scrapes_every_listener_by_service_and_worker_id(tmp_path) -> None:
    stack = shape(base_port=9000, metrics_port=9000, host="0.0.0.0")
    path = tmp_path / "prometheus.yml"
    prometheus_config.write(path, stack.listeners())
    text = path.read_text()
    assert text.startswith("#")
    config = json.loads(text.partition("\n")[2])  # JSON is YAML: Prometheus reads it
    [job] = config["scrape_configs"]
    targets = {c["labels"]["worker_id"]: c["targets"] for c in job["static_configs"]}
    assert targets["up"] == ["127.0.0.1:9000"]  # a wildcard bind is dialled on loopback
    assert targets["gateway-0"] == ["127.0.0.1:8000"]
    assert targets["decode-1"] == ["127.0.0.1:9201"]
    assert len(targets) == 10
