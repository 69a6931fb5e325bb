"""step-phases times each phase of a real engine's decode steps: the fused step's native call
(its layers and, over quantized weights, the logits head) among them, and what no timer
covers as the step's own Python."""

from __future__ import annotations

import orjson
import pytest

from bench.cli import build_parser
from shared.model.kernels import cpu_ops

pytestmark = pytest.mark.skipif(cpu_ops() is None, reason="no fused decode without the kernels")


def test_the_phases_of_a_decode_step_add_up_to_the_step(capsys) -> None:
    args = build_parser().parse_args(
        ["step-phases", "--decode-tokens", "12", "--rounds", "1", "--prompt-len", "16", "--json"]
    )
    assert args.run(args) == 0
    report = orjson.loads(capsys.readouterr().out)
    phases = report["phases_us"]
    timed = ("native step", "sampling", "metadata", "append token", "rotary tables")
    assert all(phases[name] > 0 for name in timed)
    assert phases["native step"] == max(phases.values())  # a model's step is its layers
    assert sum(phases.values()) == pytest.approx(report["step_us"], abs=1.0)
    # the native step's own timers split it into its parts, which it spends most of its time in
    parts = report["native_parts_us"]
    assert {"qkv", "attention", "o", "gate_up", "down", "final norm and head"} <= set(parts)
    assert 0.5 * phases["native step"] < sum(parts.values()) <= phases["native step"]
    assert report["decode_tok_s"] == pytest.approx(1e6 / report["step_us"], rel=1e-3)
