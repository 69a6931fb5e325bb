"""The mock model: names checked, KV bytes scaled, the pool sized as the real hardware's."""

from __future__ import annotations

import pytest

from shared.costmodel import HARDWARE, MODELS
from shared.costmodel.hardware import GB
from shared.engine.mock import MOCK_MAX_MODEL_LEN, MockSpec
from shared.errors import KvstackError
from shared.model.config import ModelConfig

LLAMA3_70B_KV_PER_TOKEN = 80 * 2 * 8 * 128 * 2  # layers, K and V, KV heads, dim, bf16


def test_unknown_names_are_refused_with_the_known_ones_listed() -> None:
    with pytest.raises(KvstackError, match="unknown mock model 'gpt-5'; known: llama3-70b, "):
        MockSpec(model="gpt-5")
    with pytest.raises(KvstackError) as error:
        MockSpec(hardware="tpu")
    assert all(name in str(error.value) for name in HARDWARE)
    with pytest.raises(KvstackError, match=r"scale must be in \(0, 1\]"):
        MockSpec(kv_scale=0)


@pytest.mark.parametrize("scale, half_bytes", [(1.0, 2048), (1e-3, 2), (1 / 256, 8), (1e-6, 1)])
def test_kv_bytes_per_token_are_the_real_ones_scaled_to_whole_bytes(scale, half_bytes) -> None:
    spec = MockSpec("llama3-70b", "a800", scale)
    assert spec.token_half_bytes == half_bytes == max(1, round(8 * 128 * 2 * scale))
    assert spec.kv_bytes_per_token == 80 * 2 * half_bytes
    assert (
        MockSpec(kv_scale=1.0).kv_bytes_per_token
        == MODELS["llama3-70b"].kv_bytes_per_token
        == LLAMA3_70B_KV_PER_TOKEN
    )


def test_the_pool_holds_what_an_8xa800_node_holds_beside_the_weights() -> None:
    spec = MockSpec()
    usable = 8 * 80 * GB * 0.9 - MODELS["llama3-70b"].weight_bytes
    real = int(usable // (LLAMA3_70B_KV_PER_TOKEN * 16))
    assert spec.real_capacity_blocks(16) == real and 80_000 < real < 90_000
    assert spec.num_blocks(16, 1 << 30) == real  # 1 GiB of scaled KV: not the bound
    assert spec.num_blocks(16, 1 << 20) == (1 << 20) // (320 * 16)  # 1 MiB: the bound


def test_hardware_without_a_memory_size_is_bounded_by_the_cache_size_alone() -> None:
    spec = MockSpec(hardware="cpu")
    assert spec.real_capacity_blocks(16) is None
    assert spec.num_blocks(16, 1 << 30) == (1 << 30) // (320 * 16)


def test_hardware_that_cannot_hold_one_block_beside_the_weights_is_refused() -> None:
    with pytest.raises(KvstackError, match="no room for one KV block"):
        MockSpec().real_capacity_blocks(10**7)


def test_the_namespace_names_the_model_and_its_scaled_layout() -> None:
    assert MockSpec().namespace == MockSpec(hardware="h100").namespace  # timing only
    assert MockSpec().namespace != MockSpec(kv_scale=1 / 256).namespace
    assert MockSpec().namespace != MockSpec(model="llama2-70b").namespace
    assert MockSpec().cost_spec == "roofline:llama3-70b:a800"


def test_workers_see_the_mock_models_layers_with_the_tokenizers_vocabulary(smollm2_dir) -> None:
    smollm2 = ModelConfig.from_dir(smollm2_dir)
    config = MockSpec().model_config(smollm2, None)
    assert (config.num_layers, config.num_kv_heads, config.head_dim) == (80, 1, 2)
    assert config.vocab_size == smollm2.vocab_size and config.eos_token_ids == smollm2.eos_token_ids
    assert config.max_position_embeddings == MOCK_MAX_MODEL_LEN > smollm2.max_position_embeddings
    assert MockSpec().model_config(smollm2, 262144).max_position_embeddings == 262144
