"""Models with quantized weights against the same weights in float32: SmolLM2's own GGUF
blocks, and a small random model re-quantized at load."""

from __future__ import annotations

import pytest
import torch

from shared.engine.config import EngineConfig
from shared.engine.engine import LLMEngine
from shared.model import ops
from shared.model.kernels import cpu_ops
from shared.model.loader import load_model
from shared.model.quant import (
    PREFILL_GEMM_MIN_ROWS,
    QuantEmbedding,
    QuantLinear,
    keep_prefill_copies,
    set_activations,
    set_prefill_dtype,
)
from shared.model.quant_formats import FORMATS
from shared.model.quant_loader import load_model_as, load_requantized
from shared.model.registry import gguf_source
from shared.model.scoring import causal_logits, greedy_agreement
from shared.model.tokenizer import Tokenizer
from shared.sampling_params import SamplingParams

MODEL = "SmolLM2-135M-Instruct"
TEXT = (
    "The history of Paris begins with a Celtic tribe on an island in the Seine. Under Rome "
    "the town grew on the left bank; in the Middle Ages it became the seat of the kings of "
    "France, and its university drew scholars from all of Europe."
)

pytestmark = pytest.mark.skipif(cpu_ops() is None, reason="no native kernels on this CPU")


@pytest.fixture(scope="module")
def float_smollm2(smollm2_dir):
    return load_model_as("float", smollm2_dir, gguf_source(MODEL), torch.float32, "cpu")


def test_the_files_blocks_predict_as_the_dequantized_float32_model(
    smollm2_dir, float_smollm2
) -> None:
    quantized = load_model_as("auto", smollm2_dir, gguf_source(MODEL), torch.float32, "cpu")
    set_activations(quantized, "float")  # the same weights, the same activations
    assert isinstance(quantized.embed_tokens, QuantEmbedding)
    assert isinstance(quantized.layers[0].self_attn.qkv_proj, QuantLinear)
    ids = Tokenizer.from_dir(smollm2_dir).encode(TEXT)
    ours, reference = causal_logits(quantized, ids), causal_logits(float_smollm2, ids)
    # NOTE: measured 1.0 here (and on 512 tokens of docs/architecture.md, bench quant): the
    # float32 model is the same Q4_1 weights dequantized; only the order of sums differs.
    assert greedy_agreement(ours, reference) >= 0.98
    torch.testing.assert_close(ours, reference, rtol=1e-3, atol=2e-3)


# NOTE: float activations multiply the same Q4_1 weights as the float32 model: the same greedy
# tokens. 8-bit activations (--activations q8, llama.cpp's way) round x: measured 10 of 10
# here (the answer ends there), and 96.5% over 512 tokens of text (bench quant, benchmarks.md);
# 16-bit ones round it 256 times finer.
@pytest.mark.parametrize(("activations", "agreement"), [("float", 1.0), ("q8", 0.9), ("q16", 1.0)])
def test_the_engine_generates_with_the_files_blocks_as_float32_greedy(
    smollm2_dir, float_smollm2, activations, agreement
) -> None:
    config = EngineConfig(
        model=MODEL, dtype="float32", weights="auto", activations=activations, num_blocks=16
    )
    engine = LLMEngine(config)
    assert engine.info.weight_bytes < 110e6  # the file's 98 MB, not 538 MB of float32
    ids = Tokenizer.from_dir(smollm2_dir).encode_chat([{"role": "user", "content": "Hi!"}])
    (result,) = engine.generate([ids], SamplingParams(max_tokens=24, temperature=0))
    # NOTE: one pass: float32's greedy choice after each prefix of the engine's own output.
    logits = causal_logits(float_smollm2, ids + result.token_ids)
    expected = logits[len(ids) - 1 : -1].argmax(-1).tolist()
    same = sum(a == b for a, b in zip(expected, result.token_ids, strict=True))
    assert same >= agreement * len(expected), (same, len(expected))


# NOTE: agreement measured on this seeded random model (its logits are nearly flat, so 4 bits
# flip many argmaxes; SmolLM2's are in docs/benchmarks.md).
@pytest.mark.parametrize(("name", "measured"), [("q8_0", 0.99), ("q4_1", 0.74), ("q4_0", 0.80)])
def test_requantized_weights_predict_near_float32(tiny_llama_dir, name, measured) -> None:
    reference = load_model(tiny_llama_dir)
    quantized = load_requantized(tiny_llama_dir, FORMATS[name], torch.float32)
    set_activations(quantized, "float")  # as measured: the weights' cost alone
    assert isinstance(quantized.layers[1].mlp.down_proj, QuantLinear)
    ids = torch.randint(0, 256, (128,), generator=torch.Generator().manual_seed(0)).tolist()
    agreement = greedy_agreement(causal_logits(quantized, ids), causal_logits(reference, ids))
    assert agreement >= measured - 0.05, agreement


@pytest.mark.parametrize(("activations", "rounding"), [("q8", 1e-3), ("q16", 1e-5)])
def test_int_prefill_computes_what_the_int_gemv_computes(
    tiny_llama_dir, activations, rounding
) -> None:
    """Prefill's rows (the dequantized GEMM) are rounded to 8 or 16 bits as the decode GEMV
    rounds them: a request prefilled again continues as one that decoded its tokens."""
    model = load_requantized(tiny_llama_dir, FORMATS["q4_1"], torch.float32)
    ids = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    set_activations(model, activations)
    prefilled = causal_logits(model, ids)
    set_activations(model, activations, max_rows=len(ids))  # every row through the GEMV
    decoded = causal_logits(model, ids)
    set_activations(model, "float")
    as_float = causal_logits(model, ids)
    torch.testing.assert_close(prefilled, decoded, rtol=1e-4, atol=1e-4)
    # the rounding is there to be matched
    assert (prefilled - as_float).abs().max() > rounding


def test_a_bf16_copy_for_prefill_predicts_as_dequantizing_on_every_pass(smollm2_dir) -> None:
    def bf16_prefill(copies: bool):
        model = load_model_as("auto", smollm2_dir, gguf_source(MODEL), torch.float32, "cpu")
        set_activations(model, "float")
        set_prefill_dtype(model, torch.bfloat16)
        if copies:
            keep_prefill_copies(model, torch.bfloat16)
        return model

    ids = Tokenizer.from_dir(smollm2_dir).encode(TEXT + " " + TEXT)
    assert len(ids) >= PREFILL_GEMM_MIN_ROWS  # the whole text is one prefill of many rows
    with_copies = causal_logits(bf16_prefill(True), ids)
    dequantized_each_pass = causal_logits(bf16_prefill(False), ids)
    # NOTE: the same bfloat16 weights and rows; only the library GEMM's blocking may differ
    assert greedy_agreement(with_copies, dequantized_each_pass) >= 0.98
    torch.testing.assert_close(with_copies, dequantized_each_pass, rtol=0, atol=0.15)


@pytest.mark.parametrize(
    ("dtype", "choice", "kept"),
    [
        # dtype bfloat16: prompts multiply in bfloat16 on any CPU, float32 in float32
        ("bfloat16", "bfloat16", torch.bfloat16),
        ("bfloat16", "quantized", None),
        ("bfloat16", "float32", None),
        ("float32", "float32", torch.float32),
        ("float32", "bfloat16", None),
    ],
)
def test_the_engine_keeps_the_copy_its_config_asks_for(dtype, choice, kept) -> None:
    config = EngineConfig(model=MODEL, dtype=dtype, prefill_weights=choice, num_blocks=16)
    model = LLMEngine(config)._runner.model
    layers = [m for m in model.modules() if type(m) is QuantLinear]
    copies = {None if m.prefill_copy is None else m.prefill_copy.dtype for m in layers}
    assert layers and copies == {kept}


def test_prompts_attending_in_bf16_products_predict_as_float32_attention(
    smollm2_dir, float_smollm2
) -> None:
    """The native kernel's bfloat16 products (prompts under --dtype auto on CPUs with
    AVX512-BF16) cost little: measured 50 of this text's 51 positions agreeing (logits within
    0.13), and 99.6-99.8% over 512 tokens of docs/architecture.md (`python -m bench quant
    --bf16-attention`, docs/benchmarks.md)."""
    native = cpu_ops()
    if not native.prefill_attention_has_bf16_products():
        pytest.skip("this build has no bfloat16 dot products (no AVX512-BF16 here)")
    ids = Tokenizer.from_dir(smollm2_dir).encode(TEXT)
    attend = lambda q, k, v: ops.prefill_attention(q, k, v, 0.125, None, torch.bfloat16)
    ours = causal_logits(float_smollm2, ids, attend)
    reference = causal_logits(float_smollm2, ids)
    assert not torch.equal(ours, reference)  # the products did round
    assert greedy_agreement(ours, reference) >= 0.95
    torch.testing.assert_close(ours, reference, rtol=0, atol=0.25)
