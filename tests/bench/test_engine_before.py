"""`bench engine --before ...`: with quantized-prefill the 'before' column is an engine whose
prompts' matmuls dequantize on every pass, beside one that keeps the bfloat16 copy; with
small-pages one whose KV is not in huge pages; with torch-prompt-attention one whose prompts
attend through torch's kernel; with copy-rows-unfused one whose decode steps the bfloat16
copies take run layer by layer."""

from __future__ import annotations

import argparse

import pytest

from bench.engine import before_side
from shared.engine.config import EngineConfig
from shared.engine.engine import LLMEngine
from shared.model.kernels import cpu_ops
from shared.model.quant import QuantLinear
from tests.shared.test_huge_pages import huge_page_bytes, thp_setting

pytestmark = pytest.mark.skipif(cpu_ops() is None, reason="no native kernels on this CPU")


def copies(engine: LLMEngine) -> set[bool]:
    return {
        m.prefill_copy is not None for m in engine._runner.model.modules() if type(m) is QuantLinear
    }


def test_the_before_engine_dequantizes_on_every_pass_and_ours_keeps_the_copy() -> None:
    # dtype bfloat16: prompts multiply in bfloat16 on any CPU, so the copy is kept as asked
    config = EngineConfig(dtype="bfloat16", prefill_weights="bfloat16", num_blocks=16)
    args = argparse.Namespace(no_routing_baseline=False, before="quantized-prefill")
    before = before_side(args, config, None)
    assert copies(before.engine) == {False}
    assert copies(LLMEngine(config)) == {True}


@pytest.mark.skipif(thp_setting("enabled") != "madvise", reason="huge pages only where asked")
def test_the_small_pages_engine_keeps_its_kv_where_torch_puts_it() -> None:
    config = EngineConfig(num_blocks=64)
    args = argparse.Namespace(no_routing_baseline=False, before="small-pages")
    before = before_side(args, config, None)
    ours = LLMEngine(config)
    assert huge_page_bytes(before.engine.kv_storage.kv.data_ptr()) == 0
    assert huge_page_bytes(ours.kv_storage.kv.data_ptr()) > 0


def test_the_torch_prompt_attention_engine_leaves_the_native_kernel_out() -> None:
    config = EngineConfig(num_blocks=16)
    args = argparse.Namespace(no_routing_baseline=False, before="torch-prompt-attention")
    before = before_side(args, config, None)
    assert before.engine._runner.backend.native_prefill is False
    assert LLMEngine(config)._runner.backend.native_prefill is True


def test_the_copy_from_16_rows_engine_sends_10_to_15_rows_to_the_gemv() -> None:
    config = EngineConfig(num_blocks=16)
    args = argparse.Namespace(no_routing_baseline=False, before="copy-from-16-rows")
    before = before_side(args, config, None)
    rows = lambda engine: {
        m.copy_min_rows for m in engine._runner.model.modules() if type(m) is QuantLinear
    }
    assert rows(before.engine) == {16}
    assert rows(LLMEngine(config)) == {10}


def test_the_copy_rows_unfused_engine_runs_those_steps_layer_by_layer() -> None:
    config = EngineConfig(num_blocks=16)
    ours = LLMEngine(config)._runner.fused
    if ours is None or not ours.all_copied:
        pytest.skip("no bfloat16 copy under --dtype auto on this CPU (no native bfloat16)")
    args = argparse.Namespace(no_routing_baseline=False, before="copy-rows-unfused")
    before = before_side(args, config, None).engine._runner.fused
    assert ours.by_copy(12) and not before.by_copy(12) and not before.fits(12)
