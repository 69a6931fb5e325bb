"""`kvstack up` refuses what the mock engine cannot run before starting anything, and a
second Ctrl-C while it drains forces the stop."""

from __future__ import annotations

import os
import signal
import time

import pytest

from services.cli.main import main
from services.cli.up import shut_down
from shared.errors import KvstackError


def test_attention_offload_with_the_mock_engine_is_refused(capsys) -> None:
    assert main(["up", "--engine", "mock", "--attention-workers", "2"]) == 2
    assert "--attention-workers does not run with --engine mock" in capsys.readouterr().err


def test_an_unknown_mock_model_is_refused_with_the_known_ones(capsys) -> None:
    assert main(["up", "--engine", "mock", "--mock-model", "llama4"]) == 2
    assert "known: llama3-70b, llama2-70b" in capsys.readouterr().err


@pytest.mark.parametrize("size", ["0", "2"])
def test_a_nats_cluster_of_two_or_none_is_refused(capsys, size) -> None:
    assert main(["up", "--nats-cluster", size]) == 2
    assert "--nats-cluster takes 1 (one nats-server) or 3 or more" in capsys.readouterr().err


def test_a_nats_cluster_with_an_outside_nats_is_refused(capsys) -> None:
    assert main(["up", "--nats-cluster", "3", "--nats", "nats://elsewhere:4222"]) == 2
    assert "does not go with --nats" in capsys.readouterr().err


class DrainingStack:
    """Stands in for a Stack whose drain the user cuts short with a second Ctrl-C."""

    killed = False

    def stop(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        deadline = time.monotonic() + 5
        while not self.killed and time.monotonic() < deadline:
            time.sleep(0.01)

    def kill(self) -> None:
        self.killed = True


def test_ctrl_c_while_draining_kills_every_service(capsys) -> None:
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    stack = DrainingStack()
    try:
        shut_down(stack)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    assert stack.killed
    assert capsys.readouterr().err.splitlines() == [
        "kvstack: draining (Ctrl-C again to force) ...",
        "kvstack: forcing the stop: killed every service",
        "kvstack: stopped",
    ]


def test_an_attention_group_that_cannot_split_the_kv_heads_is_refused_at_once(capsys) -> None:
    assert main(["up", "--attention-workers", "2"]) == 2  # SmolLM2 has 3 KV heads
    assert "cannot split 3 KV heads evenly" in capsys.readouterr().err


def test_up_passes_the_reliability_and_fairness_flags_to_its_services() -> None:
    from services.cli.main import build_parser
    from services.cli.up import stack_config
    from services.stack.stack import Stack

    args = build_parser().parse_args(
        ["up", "--migration-limit", "5", "--placement-wait", "3", "--long-prefill-tokens", "256"]
    )
    commands = dict(Stack(stack_config(args)).commands())
    gateway = build_parser().parse_args(commands["gateway-0"])
    prefill = build_parser().parse_args(commands["prefill-0"])
    assert (gateway.migration_limit, gateway.placement_wait) == (5, 3.0)
    assert prefill.long_prefill_tokens == 256


def test_up_passes_every_served_model_name_to_the_gateway() -> None:
    from services.cli.main import build_parser
    from services.cli.up import stack_config
    from services.stack.stack import Stack

    args = build_parser().parse_args(["up", "--served-model-name", "smol", "chat"])
    commands = dict(Stack(stack_config(args)).commands())
    gateway = build_parser().parse_args(commands["gateway-0"])
    assert gateway.served_model_name == ["smol", "chat"]
    assert "--served-model-name" not in commands["decode-0"]
    plain = dict(Stack(stack_config(build_parser().parse_args(["up"]))).commands())
    assert build_parser().parse_args(plain["gateway-0"]).served_model_name == ()


def test_up_shares_out_the_cores_and_lets_each_worker_thread_per_core(monkeypatch) -> None:
    from services.cli.main import build_parser
    from services.cli.up import stack_config
    from services.stack import pinning
    from services.stack.stack import Stack

    monkeypatch.setattr(pinning, "usable_cores", lambda: (0, 1, 2, 3, 4, 5))
    commands = dict(Stack(stack_config(build_parser().parse_args(["up"]))).commands())
    prefill = build_parser().parse_args(commands["prefill-0"])
    decode = build_parser().parse_args(commands["decode-0"])
    assert (prefill.cores, decode.cores) == ("0-2", "3-5")
    assert prefill.threads is None  # the worker takes one thread per core of its share
    given = dict(
        Stack(stack_config(build_parser().parse_args(["up", "--cores", "4-5"]))).commands()
    )
    assert build_parser().parse_args(given["decode-0"]).cores == "5"
    with pytest.raises(KvstackError, match="may not run on 6-7"):
        stack_config(build_parser().parse_args(["up", "--cores", "4-7"]))


def test_up_with_two_conductors_elects_one_by_a_lease_and_gives_each_a_port() -> None:
    from services.cli.main import build_parser
    from services.cli.up import stack_config
    from services.stack.stack import Stack

    args = build_parser().parse_args(["up", "--conductors", "2", "--lease-ttl", "2"])
    commands = dict(Stack(stack_config(args)).commands())
    conductors = [build_parser().parse_args(commands[f"conductor-{i}"]) for i in (0, 1)]
    assert [c.lease_ttl for c in conductors] == [2.0, 2.0]
    assert [c.http_port for c in conductors] == [8101, 8102]
    alone = dict(Stack(stack_config(build_parser().parse_args(["up"]))).commands())
    assert build_parser().parse_args(alone["conductor-0"]).lease_ttl == 0  # no lease
    with pytest.raises(KvstackError, match="--conductors"):
        stack_config(build_parser().parse_args(["up", "--conductors", "0"]))


def test_up_passes_device_to_its_workers_and_checks_gpus_before_starting(monkeypatch) -> None:
    import torch

    from services.cli.main import build_parser
    from services.cli.up import stack_config
    from services.stack.stack import Stack

    args = build_parser().parse_args(["up", "--device", "cpu"])
    commands = dict(Stack(stack_config(args)).commands())
    assert build_parser().parse_args(commands["decode-0"]).device == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(KvstackError, match="torch sees no CUDA device"):
        stack_config(build_parser().parse_args(["up", "--gpus", "0"]))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    for wrong, message in (("0,2", "has 2 CUDA device"), ("one", "takes all or device indices")):
        with pytest.raises(KvstackError, match=message):
            stack_config(build_parser().parse_args(["up", "--gpus", wrong]))
    config = stack_config(build_parser().parse_args(["up", "--gpus", "all", "--prefill", "2"]))
    assert config.worker_devices == ("cuda:0", "cuda:1")
