"""SmolLM2 with its GGUF blocks kept quantized against the same file dequantized to float32."""

from __future__ import annotations

import pytest
import torch

from shared.engine.config import EngineConfig
from shared.engine.engine import LLMEngine
from shared.engine.sampling_params import SamplingParams
from shared.model.kernels import cpu_ops
from shared.model.quant import QuantEmbedding, QuantLinear
from shared.model.quant_loader import load_model_as
from shared.model.registry import gguf_source
from shared.model.scoring import causal_logits, greedy_agreement
from shared.model.tokenizer import Tokenizer

MODEL = "SmolLM2-135M-Instruct"
TEXT = (
    "The history of Paris begins with a Celtic tribe on an island in the Seine. Under Rome "
    "the town grew on the left bank; in the Middle Ages it became the seat of the kings of "
    "France, and its university drew scholars from all of Europe."
)

pytestmark = pytest.mark.skipif(cpu_ops() is None, reason="no native kernels on this CPU")


@pytest.fixture(scope="module")
def scored(smollm2_dir) -> dict[str, torch.Tensor]:
    ids = Tokenizer.from_dir(smollm2_dir).encode(TEXT)
    gguf = gguf_source(MODEL)
    return {
        weights: causal_logits(load_model_as(weights, smollm2_dir, gguf, torch.float32, "cpu"), ids)
        for weights in ("float", "auto", "q8_0")
    }


def test_the_files_blocks_predict_as_the_dequantized_float32_model(scored) -> None:
    # NOTE: measured 1.0 here (and on 256 tokens of README.md): float32 is the same Q4_1
    # weights dequantized, so only the order of float32 sums differs.
    assert greedy_agreement(scored["auto"], scored["float"]) >= 0.98
    torch.testing.assert_close(scored["auto"], scored["float"], rtol=1e-3, atol=2e-3)


def test_requantized_q8_0_mostly_agrees(scored) -> None:
    # NOTE: measured 0.965 on 256 tokens of README.md (q8_0 of the dequantized Q4_1 weights).
    assert greedy_agreement(scored["q8_0"], scored["float"]) >= 0.9


def test_the_engine_holds_the_files_blocks_and_generates_as_float32(smollm2_dir) -> None:
    params = SamplingParams(max_tokens=16, temperature=0)
    prompt = Tokenizer.from_dir(smollm2_dir).encode_chat([{"role": "user", "content": "Hi!"}])
    outputs = {}
    for weights in ("auto", "float"):
        config = EngineConfig(model=MODEL, dtype="float32", weights=weights, num_blocks=64)
        engine = LLMEngine(config)
        model = engine._runner.model  # type: ignore[attr-defined]
        assert isinstance(model.embed_tokens, QuantEmbedding) == (weights == "auto")
        assert isinstance(model.layers[0].mlp.gate_up_proj, QuantLinear) == (weights == "auto")
        (outputs[weights],) = engine.generate([prompt], params)
    assert outputs["auto"].token_ids == outputs["float"].token_ids
