"""`bench engine --before ...`: with quantized-prefill the 'before' column is an engine whose
prompts' matmuls dequantize on every pass, beside one that keeps the bfloat16 copy; with
small-pages one whose KV is not in huge pages; with torch-prompt-attention one whose prompts
attend through torch's kernel; with copy-rows-unfused one whose decode steps the bfloat16
copies take run layer by layer; with plain-rows one whose quantized rows are in GGUF's order;
with copy-from-N-rows one whose decode batches take the copies from N rows."""

from __future__ import annotations

import argparse

import pytest

from bench.engine import before_side
from shared.engine.config import EngineConfig, cpu_has_amx
from shared.engine.engine import LLMEngine
from shared.model import quant
from shared.model.kernels import cpu_ops
from shared.model.quant import QuantLinear
from shared.sampling_params import SamplingParams
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
    # NOTE: a CPU with AMX keeps torch's prompt attention by default too (shared/engine/runner.py)
    assert LLMEngine(config)._runner.backend.native_prefill is not cpu_has_amx()


@pytest.mark.parametrize("rows", [10, 16])
def test_the_copy_from_rows_engines_send_that_many_rows_to_the_copy(rows) -> None:
    config = EngineConfig(num_blocks=16)
    args = argparse.Namespace(no_routing_baseline=False, before=f"copy-from-{rows}-rows")
    before = before_side(args, config, None)
    copy_min_rows = lambda engine: {
        m.copy_min_rows for m in engine._runner.model.modules() if type(m) is QuantLinear
    }
    assert copy_min_rows(before.engine) == {rows}
    assert copy_min_rows(LLMEngine(config)) == {quant.BF16_COPY_MIN_ROWS}


def test_the_copy_rows_unfused_engine_runs_those_steps_layer_by_layer() -> None:
    config = EngineConfig(num_blocks=16)
    ours = LLMEngine(config)._runner.fused
    if ours is None or not ours.all_copied:
        pytest.skip("no bfloat16 copy under --dtype auto on this CPU (no native bfloat16)")
    args = argparse.Namespace(no_routing_baseline=False, before="copy-rows-unfused")
    before = before_side(args, config, None).engine._runner.fused
    assert ours.by_copy(20) and not before.by_copy(20) and not before.fits(20)


def test_the_plain_rows_engine_keeps_gguf_order_and_decodes_as_ours() -> None:
    config = EngineConfig(num_blocks=16)  # the default model: Q4_1 layers, q16 activations
    ours = LLMEngine(config)
    args = argparse.Namespace(no_routing_baseline=False, before="plain-rows")
    before = before_side(args, config, None).engine
    layers = lambda engine: [
        m for m in engine._runner.model.modules() if type(m) is QuantLinear and m.can_interleave()
    ]
    assert layers(ours) and all(m.interleaved for m in layers(ours))
    assert not any(m.interleaved for m in layers(before))
    if ours._runner.fused is not None:
        assert before._runner.fused is not None  # built again, on the rows as they are now
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    prompt = list(range(100, 140))
    tokens = [engine.generate([prompt], params)[0].token_ids for engine in (ours, before)]
    # NOTE: the same sums in another order: float32's last bits, too few to turn a greedy token
    # this early (rows read in the wrong layout would answer nonsense)
    assert tokens[0] == tokens[1]
