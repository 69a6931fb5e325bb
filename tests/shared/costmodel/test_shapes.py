"""Model shapes: presets agree with real configs, and the counts are the published ones."""

from __future__ import annotations

import pytest

from shared.costmodel import MODELS
from shared.costmodel.shapes import ModelShape
from shared.model.config import ModelConfig


def test_the_smollm2_preset_is_the_real_models_shape(smollm2_dir) -> None:
    config = ModelConfig.from_dir(smollm2_dir)
    assert ModelShape.of(config, "smollm2-135m") == MODELS["smollm2-135m"]


def test_kv_bytes_follow_the_element_size(smollm2_dir) -> None:
    config = ModelConfig.from_dir(smollm2_dir)
    assert ModelShape.of(config, "s").kv_bytes_per_token == 30 * 2 * 3 * 64 * 2
    assert ModelShape.of(config, "s", bytes_per_element=4).kv_bytes_per_token == 46_080


@pytest.mark.parametrize(
    "name,billions,tied",
    [
        ("smollm2-135m", 0.135, True),
        ("llama3-8b", 8.03, False),
        ("qwen2-7b", 7.62, False),
        ("llama3-70b", 70.6, False),
    ],
)
def test_parameter_counts_are_the_published_ones(name, billions, tied) -> None:
    """`params` counts what a forward pass reads: an untied input embedding is only indexed."""
    shape = MODELS[name]
    embedding = 0 if tied else shape.vocab_size * shape.hidden_size
    assert (shape.params + embedding) / 1e9 == pytest.approx(billions, rel=0.01)


def test_chunked_prefill_computes_the_same_attention_as_one_pass() -> None:
    shape = MODELS["llama3-8b"]
    whole = shape.attention_flops(1000, 0)
    chunks = shape.attention_flops(300, 0) + shape.attention_flops(700, 300)
    assert chunks == pytest.approx(whole)


def test_one_token_attends_to_its_context_and_itself() -> None:
    shape = MODELS["llama3-8b"]
    per_pair = 4.0 * shape.num_layers * shape.num_heads * shape.head_dim
    assert shape.attention_flops(1, 99) == per_pair * 100
