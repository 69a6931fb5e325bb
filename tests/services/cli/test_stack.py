"""The launcher's commands: a mock stack gives every worker and the gateway the same
engine flags, and the conductor the cost model the workers take their time from."""
from __future__ import annotations

from services.cli.main import build_parser
from services.cli.serve import engine_options
from services.cli.stack import Stack, StackConfig
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
