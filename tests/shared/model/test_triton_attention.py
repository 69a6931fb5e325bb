"""The Triton paged-attention kernels against the torch backend, on the same cache.

On a machine without a GPU they run in Triton's interpreter: CI checks the kernels'
indexing, masking and online softmax there; speed needs a GPU.
"""

from __future__ import annotations

import os

import pytest
import torch

from shared.engine.config import EngineConfig
from shared.engine.engine import LLMEngine
from shared.engine.metadata import attention_metadata
from shared.kvcache.storage import KVStorage
from shared.model.attention import TorchPagedAttention
from shared.model.attention_choice import attention_backend
from shared.sampling_params import SamplingParams
from tests.shared.model.chunks import Chunk

pytestmark = pytest.mark.triton
pytest.importorskip("triton", reason="Triton is not installed (it comes with the dev extra)")
assert torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"  # conftest.py
from shared.model.triton_attention import TritonPagedAttention  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BLOCK_SIZE = 8


def run_both(
    chunks, num_heads, num_kv_heads, head_dim, dtype, num_blocks=16, block_size=BLOCK_SIZE
):
    torch.manual_seed(0)
    storage = KVStorage(1, num_blocks, block_size, num_kv_heads, head_dim, dtype, DEVICE)
    storage.kv.normal_()  # prefixes already cached; the chunks overwrite their own slots
    _, meta = attention_metadata(chunks, block_size, DEVICE)
    num_tokens = sum(c.num_tokens for c in chunks)
    q = torch.randn(num_tokens, num_heads, head_dim, dtype=dtype, device=DEVICE)
    k, v = (
        torch.randn(num_tokens, num_kv_heads, head_dim, dtype=dtype, device=DEVICE) for _ in "kv"
    )
    outputs = []
    for backend_type in (TorchPagedAttention, TritonPagedAttention):
        copy = KVStorage(1, num_blocks, block_size, num_kv_heads, head_dim, dtype, DEVICE)
        copy.kv.copy_(storage.kv)
        outputs.append((backend_type(copy, head_dim).forward(0, q, k, v, meta), copy.kv))
    return outputs


MIXED_STEP = [
    Chunk(0, 1, (3,)),  # decode: a one-token context
    Chunk(36, 1, (9, 2, 14, 5, 0)),  # decode over scattered blocks, the last partly filled
    Chunk(0, 20, (6, 7, 8)),  # prefill without a prefix: attends to its own chunk
    Chunk(19, 13, (11, 1, 12, 4)),  # prefill over a cached prefix, blocks scattered
]


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim"),
    [(6, 2, 24), (4, 4, 16), (9, 3, 64)],  # GQA with a head size no power of two; MHA; SmolLM2
)
def test_triton_matches_torch_on_a_mixed_step(num_heads, num_kv_heads, head_dim):
    (expected, expected_kv), (got, got_kv) = run_both(
        MIXED_STEP, num_heads, num_kv_heads, head_dim, torch.float32
    )
    assert torch.equal(got_kv, expected_kv)  # the new k, v written to the same slots
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "chunks",
    [
        [Chunk(40, 1, (1, 2, 3, 4, 5, 6))],  # decode alone
        [Chunk(0, 33, (1, 2, 3, 4, 5))],  # a prefill alone, rows past the last query tile
        [Chunk(8, 1, (1, 2)), Chunk(16, 1, (3, 4, 5)), Chunk(5, 2, (6,))],  # short chunk
    ],
)
def test_triton_matches_torch_on_single_kinds(chunks):
    (expected, _), (got, _) = run_both(chunks, 6, 2, 32, torch.float32)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


def test_long_decode_contexts_split_over_programs_and_merge(monkeypatch):
    """Contexts split over programs (as many as a GPU's multiprocessors want: here forced,
    the interpreter counts one); a short context beside long ones leaves its later splits
    empty, which the merge must weigh as nothing."""
    from shared.model import triton_attention

    monkeypatch.setattr(triton_attention, "PROGRAMS_PER_SM", 64)  # 9 splits of 128 tokens
    long_blocks = tuple(range(70, 1, -1))  # 69 scattered blocks of 16: 1,100 tokens
    chunks = [Chunk(1099, 1, long_blocks), Chunk(4, 1, (75,)), Chunk(600, 1, tuple(range(38)))]
    (expected, _), (got, _) = run_both(chunks, 6, 2, 32, torch.float32, 80, 16)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


def test_bfloat16_within_its_tolerance():
    (expected, _), (got, _) = run_both(MIXED_STEP, 6, 2, 32, torch.bfloat16)
    torch.testing.assert_close(got.float(), expected.float(), atol=2e-2, rtol=2e-2)


def test_auto_is_torch_on_cpu_and_triton_can_be_forced():
    storage = KVStorage(1, 4, BLOCK_SIZE, 2, 16, torch.float32, "cpu")
    assert isinstance(attention_backend("auto", storage, 16), TorchPagedAttention)
    assert isinstance(attention_backend("triton", storage, 16), TritonPagedAttention)


def test_an_engine_on_triton_attention_decodes_as_on_torch(tiny_llama_dir):
    """Chunked prefill over cached prefixes beside decodes, greedy, token for token."""
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 256, (n,), generator=gen).tolist() for n in (5, 19, 2)]
    greedy = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    outputs = []
    for attention in ("torch", "triton"):
        config = EngineConfig(
            model=str(tiny_llama_dir),
            device=DEVICE,
            dtype="float32",
            attention=attention,
            block_size=4,
            num_blocks=32,
            max_num_batched_tokens=8,
        )
        outputs.append([r.token_ids for r in LLMEngine(config).generate(prompts, greedy)])
    assert outputs[0] == outputs[1]
