"""The launcher's commands: a mock stack gives every worker and the gateway the same
engine flags, and the conductor the cost model the workers take their time from; every
child drains as long as the stack says and traces where it says, they stop in order, and
logs rotate per run."""

from __future__ import annotations

from pathlib import Path

from services.cli.main import build_parser
from services.cli.service import engine_options
from services.stack.logs import rotate
from services.stack.process import Process, stop_tiers
from services.stack.stack import Stack, StackConfig
from shared.engine.mock import MockSpec

SPEC = MockSpec("llama2-70b", "h20", 1 / 512)


def commands(**config) -> dict[str, list[str]]:
    return dict(Stack(StackConfig(num_prefill=2, num_decode=2, **config)).commands())


def test_a_mock_stack_runs_every_worker_and_the_gateway_on_the_same_mock_model() -> None:
    stack = commands(mock=SPEC)
    for name in ("prefill-0", "prefill-1", "decode-0", "decode-1", "gateway-0"):
        args = build_parser().parse_args(stack[name])
        assert engine_options(args)["mock"] == SPEC, name
    conductor = build_parser().parse_args(stack["conductor-0"])
    assert conductor.cost_model == "roofline:llama2-70b:h20"


def test_a_torch_stack_passes_no_engine_flags() -> None:
    stack = commands()
    assert not any("--engine" in args or "--cost-model" in args for args in stack.values())
    assert engine_options(build_parser().parse_args(stack["decode-0"]))["mock"] is None


def test_every_child_gets_the_drain_timeout_and_otlp_endpoint_and_parses_them() -> None:
    endpoint = "http://collector:4318"
    stack = commands(num_kvstore=1, num_attention=1, drain_timeout=7.5, otlp_endpoint=endpoint)
    for name, args in stack.items():
        parsed = build_parser().parse_args(args)
        assert (parsed.drain_timeout, parsed.otlp_endpoint) == (7.5, endpoint), name


def test_without_an_otlp_endpoint_no_child_is_traced(monkeypatch) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    for name, args in commands().items():
        assert "--otlp-endpoint" not in args, name
        assert build_parser().parse_args(args).otlp_endpoint == "", name


def test_the_gateway_stops_first_then_workers_then_attention_then_the_rest() -> None:
    stack = Stack(StackConfig(num_prefill=2, num_decode=1, num_kvstore=1, num_attention=1))
    processes = [
        Process(name, args, popen=None, log_path=Path(name)) for name, args in stack.commands()
    ]
    tiers = [[p.name for p in tier] for tier in stop_tiers(processes)]
    assert tiers == [
        ["gateway-0"],
        ["prefill-0", "prefill-1", "decode-0"],
        ["attention-0-0"],
        ["conductor-0", "kvstore-0"],
    ]


def test_a_new_run_keeps_the_previous_log_as_dot_one(tmp_path) -> None:
    log = tmp_path / "decode-0.log"
    rotate(log)  # no previous run: nothing happens
    assert not list(tmp_path.iterdir())
    log.write_text("run 1\n")
    rotate(log)
    log.write_text("run 2\n")
    rotate(log)
    assert not log.exists() and (tmp_path / "decode-0.log.1").read_text() == "run 2\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["decode-0.log.1"]


def test_with_worker_cores_each_model_worker_is_pinned_to_its_share() -> None:
    stack = commands(worker_cores=(0, 1, 2, 3), num_attention=0)
    cores = {
        name: build_parser().parse_args(args).cores
        for name, args in stack.items()
        if args[0] in ("prefill", "decode")
    }
    assert cores == {"prefill-0": "0", "prefill-1": "1", "decode-0": "2", "decode-1": "3"}
    for name in ("gateway-0", "conductor-0"):
        assert "--cores" not in stack[name]
    assert not any("--cores" in args for args in commands().values())  # none given: none


def test_with_worker_devices_prefill_and_decode_go_round_robin_over_them() -> None:
    stack = commands(worker_devices=("cuda:0", "cuda:1"), num_attention=1)
    workers = ("prefill-0", "prefill-1", "decode-0", "decode-1")
    assert [build_parser().parse_args(stack[name]).device for name in workers] == [
        "cuda:0",
        "cuda:1",
        "cuda:0",
        "cuda:1",
    ]
    assert all("--device" not in stack[n] for n in ("attention-0-0", "gateway-0"))
