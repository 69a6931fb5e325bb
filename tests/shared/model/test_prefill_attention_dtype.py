"""Under torch's kernel, prompts attend in bfloat16 over a float32 KV where their matmuls
multiply in it (TorchPagedAttention.prefill_dtype): within bfloat16's tolerance of float32,
decode rows and the KV written untouched. The native kernel sums in float32, its products in
bfloat16 where that says so and the CPU has bfloat16 dot products, else in float32."""

from __future__ import annotations

import pytest
import torch

from shared.engine.metadata import attention_metadata
from shared.kvcache.storage import KVStorage
from shared.model import ops
from shared.model.attention import TorchPagedAttention
from shared.model.kernels import cpu_ops
from tests.shared.model.chunks import Chunk

BLOCK_SIZE, HEADS, KV_HEADS, HEAD_DIM = 8, 4, 2, 16


CHUNKS = [
    Chunk(36, 1, (9, 2, 14, 5, 0)),  # decode
    Chunk(0, 20, (6, 7, 8)),  # a prompt without a prefix
    Chunk(19, 13, (11, 1, 12, 4)),  # a prompt over a cached prefix
]


def attend(prefill_dtype: torch.dtype | None) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    storage = KVStorage(1, 16, BLOCK_SIZE, KV_HEADS, HEAD_DIM, torch.float32)
    storage.kv.normal_()  # the prefix, already cached
    _, meta = attention_metadata(CHUNKS, BLOCK_SIZE, "cpu")
    num_tokens = sum(c.num_tokens for c in CHUNKS)
    q = torch.randn(num_tokens, HEADS, HEAD_DIM)
    k, v = (torch.randn(num_tokens, KV_HEADS, HEAD_DIM) for _ in "kv")
    backend = TorchPagedAttention(storage, HEAD_DIM)
    backend.prefill_dtype = prefill_dtype
    return backend.forward(0, q, k, v, meta), storage.kv


def test_prompts_attend_in_bfloat16_within_its_tolerance_and_the_rest_stays_float32(
    monkeypatch,
) -> None:
    monkeypatch.setattr(ops, "_native", lambda x: None)  # torch's kernels
    exact, exact_kv = attend(None)
    rounded, rounded_kv = attend(torch.bfloat16)
    assert rounded.dtype == torch.float32
    assert torch.equal(rounded_kv, exact_kv)  # the KV is written as computed
    assert torch.equal(rounded[:1], exact[:1])  # decode rows attend in the KV's dtype
    prompts = slice(1, None)
    assert not torch.equal(rounded[prompts], exact[prompts])  # they did go through bfloat16
    assert torch.allclose(rounded[prompts], exact[prompts], atol=3e-2, rtol=0)


def test_the_native_kernel_takes_bfloat16_products_where_the_cpu_has_them(monkeypatch) -> None:
    module = cpu_ops()
    if module is None:
        pytest.skip("no native kernels on this CPU")
    monkeypatch.setattr(ops, "_native", lambda x: None)
    exact, exact_kv = attend(None)
    monkeypatch.setattr(ops, "_native", lambda x: module)
    native, native_kv = attend(torch.bfloat16)
    assert torch.equal(native_kv, exact_kv)  # the KV is written as computed
    assert torch.allclose(native[:1], exact[:1], atol=1e-5, rtol=0)  # decode rows: float32
    if module.prefill_attention_has_bf16_products():
        prompts = slice(1, None)
        assert not torch.equal(native[prompts], attend(None)[0][prompts])
        assert torch.allclose(native, exact, atol=3e-2, rtol=0)
    else:
        assert torch.allclose(native, exact, atol=1e-5, rtol=0)


@pytest.mark.parametrize("amx", [True, False])
def test_cpus_with_amx_keep_torchs_bfloat16_prompt_attention(monkeypatch, amx) -> None:
    """Where prompts attend in bfloat16, AMX CPUs keep torch's kernel (it multiplies on the
    tiles there); the others take the native one."""
    from shared.engine import runner
    from shared.engine.config import EngineConfig
    from shared.engine.engine import LLMEngine

    config = EngineConfig(num_blocks=16)
    if not runner.prefill_bf16(config):
        pytest.skip("prompts multiply in float32 on this CPU")
    monkeypatch.setattr(runner, "cpu_has_amx", lambda: amx)
    backend = LLMEngine(config)._runner.backend
    assert backend.prefill_dtype == torch.bfloat16
    assert backend.native_prefill is not amx
