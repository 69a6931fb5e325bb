"""`bench engine --before quantized-prefill`: the 'before' column is an engine whose prompts'
matmuls dequantize on every pass, beside one that keeps the bfloat16 copy."""

from __future__ import annotations

import argparse

import pytest

from bench.engine import before_side
from shared.engine.config import EngineConfig
from shared.engine.engine import LLMEngine
from shared.model.kernels import cpu_ops
from shared.model.quant import QuantLinear

pytestmark = pytest.mark.skipif(cpu_ops() is None, reason="no native kernels on this CPU")


def copies(engine: LLMEngine) -> set[bool]:
    return {
        m.bf16_copy is not None for m in engine._runner.model.modules() if type(m) is QuantLinear
    }


def test_the_before_engine_dequantizes_on_every_pass_and_ours_keeps_the_copy() -> None:
    # dtype bfloat16: prompts multiply in bfloat16 on any CPU, so the copy is kept as asked
    config = EngineConfig(dtype="bfloat16", prefill_weights="bfloat16", num_blocks=16)
    args = argparse.Namespace(no_routing_baseline=False, before="quantized-prefill")
    before = before_side(args, config, None)
    assert copies(before.engine) == {False}
    assert copies(LLMEngine(config)) == {True}
