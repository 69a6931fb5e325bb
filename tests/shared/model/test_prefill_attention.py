"""The native prompt-attention kernel (prefill_attention.cpp) against torch's causal softmax,
on every build this CPU runs (the AVX2 one too on AVX-512 machines), in float32 products and,
where the build has them, bfloat16 ones."""

from __future__ import annotations

import pytest
import torch

from shared.model import ops
from shared.model.attention import causal_mask
from shared.model.kernels import cpu_ops, supported_isas

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
# (new tokens T, context L, heads, kv heads, head_dim): one token; vector tails (head_dim 20,
# 72); several query blocks of 32 with a partial last one; a cached prefix (L > T) reaching
# over several key blocks; heads without grouping; a context whose packed keys and values
# outgrow the kernel's 64 MB for both kv heads at once (packed one head at a time).
SHAPES = [
    (1, 1, 2, 1, 64),
    (13, 13, 4, 2, 20),
    (70, 70, 9, 3, 64),
    (37, 200, 9, 3, 64),
    (96, 160, 6, 6, 72),
    (4, 20000, 4, 2, 256),
]


@pytest.fixture(params=supported_isas() or pytest.skip("no native kernels on this CPU"))
def native(request):
    module = cpu_ops(request.param)
    assert module is not None, f"the {request.param} build failed"
    return module


@pytest.fixture(params=list(TOLERANCE), ids=lambda d: str(d).split(".")[-1])
def dtype(request) -> torch.dtype:
    return request.param


def inputs(T: int, L: int, H: int, Hkv: int, D: int, dtype: torch.dtype):
    gen = torch.Generator().manual_seed(T * 1000 + L)
    q = torch.randn(T, H, D, generator=gen) * 3  # peaked scores: softmax's range matters
    k, v = (torch.randn(L, Hkv, D, generator=gen) for _ in "kv")
    return q.to(dtype), k.to(dtype), v.to(dtype)


def attend(native, q, k, v, bf16_products: bool = False) -> torch.Tensor:
    out = q.new_empty(q.shape)
    native.prefill_attention(out, q, k, v, q.shape[2] ** -0.5, bf16_products)
    return out


@pytest.fixture
def paired(native):
    """A build whose bfloat16 products are the CPU's (AVX512-BF16)."""
    if not native.prefill_attention_has_bf16_products():
        pytest.skip("this build has no bfloat16 dot products (no AVX512-BF16 here)")
    return native


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """torch's softmax attention in float32 over the same (rounded) inputs."""
    T, L = q.shape[0], k.shape[0]
    mask = causal_mask(T, L) if L > T else None
    return ops.prefill_attention_torch(q.float(), k.float(), v.float(), q.shape[2] ** -0.5, mask)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_prompt_attention_is_torchs_causal_softmax(native, dtype, shape) -> None:
    q, k, v = inputs(*shape, dtype)
    out, expected = attend(native, q, k, v), reference(q, k, v)
    assert out.dtype == dtype
    err = (out.float() - expected).abs().max().item()
    assert err <= TOLERANCE[dtype] * max(1.0, expected.abs().max().item()), err


def test_rows_of_a_fused_qkv_projection_and_any_thread_count_give_the_same_bits(native) -> None:
    """q, k, v as the model hands them (views into one [T, (H + 2 H_kv) D] row) equal their
    contiguous copies, and each row's sums do not depend on how the rows were split."""
    T, H, Hkv, D = 75, 9, 3, 64
    qkv = torch.randn(T, (H + 2 * Hkv) * D, generator=torch.Generator().manual_seed(5))
    q, k, v = qkv.split([H * D, Hkv * D, Hkv * D], dim=-1)
    q, k, v = q.view(T, H, D), k.view(T, Hkv, D), v.view(T, Hkv, D)
    assert not q.is_contiguous()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = attend(native, q.contiguous(), k.contiguous(), v.contiguous())
        torch.set_num_threads(3)
        assert torch.equal(attend(native, q, k, v), alone)
    finally:
        torch.set_num_threads(threads)


def test_a_chunk_over_its_cached_prefix_equals_the_same_rows_of_the_whole_prompt(native) -> None:
    """What a prefix-cache hit computes for the new tokens is what attending over the whole
    prompt computes for them, bit for bit: keys are blocked from the context's start."""
    q, k, v = inputs(150, 150, 9, 3, 64, torch.float32)
    whole = attend(native, q, k, v)
    for cached in (1, 40, 64, 149):
        assert torch.equal(attend(native, q[cached:], k, v), whole[cached:]), cached


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_bf16_products_are_torchs_softmax_over_inputs_rounded_to_bf16(paired, dtype, shape):
    q, k, v = inputs(*shape, dtype)
    out = attend(paired, q, k, v, bf16_products=True)
    rounded = [t.bfloat16() for t in (q, k, v)]
    expected = reference(*rounded)
    err = (out.float() - expected).abs().max().item()
    # the probabilities are rounded to bfloat16 too (8 bits): a few parts in a thousand
    assert err <= 2e-2 * max(1.0, expected.abs().max().item()), err
    if dtype == torch.float32 and shape[0] > 1:  # the products are not float32's
        assert not torch.equal(out, attend(paired, q, k, v))


def test_bf16_products_keep_chunks_and_threads_bit_for_bit(paired) -> None:
    """A prefix-cache hit's rows equal the whole prompt's, and any thread count gives the same
    bits, in bfloat16 products as in float32 ones."""
    q, k, v = inputs(150, 150, 9, 3, 64, torch.float32)
    whole = attend(paired, q, k, v, bf16_products=True)
    for cached in (1, 40, 64, 149):
        assert torch.equal(attend(paired, q[cached:], k, v, True), whole[cached:]), cached
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(attend(paired, q, k, v, True), whole)
    finally:
        torch.set_num_threads(threads)


def test_a_build_without_bf16_products_computes_float32_ones(native) -> None:
    if native.prefill_attention_has_bf16_products():
        pytest.skip("this build has bfloat16 dot products")
    q, k, v = inputs(70, 70, 9, 3, 64, torch.float32)
    assert torch.equal(attend(native, q, k, v, True), attend(native, q, k, v))


def test_inputs_the_kernel_cannot_take_are_refused(native) -> None:
    q, k, v = inputs(8, 8, 4, 2, 16, torch.float32)
    with pytest.raises(RuntimeError, match="one dtype"):
        attend(native, q, k.bfloat16(), v)
    with pytest.raises(RuntimeError, match="queries"):
        attend(native, q, k[:4], v[:4])  # fewer keys than queries
    with pytest.raises(RuntimeError, match="contiguous"):
        attend(native, q.transpose(1, 2).contiguous().transpose(1, 2), k, v)


def test_the_op_takes_the_kernel_where_it_can_and_torch_elsewhere(monkeypatch) -> None:
    """ops.prefill_attention: the native kernel where built and the inputs fit it (float32
    sums; bfloat16 products where `dtype` asks for bfloat16 and the build has them, else
    float32 ones); torch's kernel in `dtype` otherwise."""
    module = cpu_ops()
    if module is None:
        pytest.skip("no native kernels on this CPU")
    q, k, v = inputs(40, 60, 4, 2, 32, torch.float32)
    mask, scale = causal_mask(40, 60), 32**-0.5
    exact = ops.prefill_attention_torch(q, k, v, scale, mask)
    monkeypatch.setattr(ops, "_native", lambda x: module)
    assert torch.allclose(ops.prefill_attention(q, k, v, scale, mask), exact, atol=1e-5, rtol=0)
    asked_bf16 = ops.prefill_attention(q, k, v, scale, mask, torch.bfloat16)
    expected = attend(module, q, k, v, module.prefill_attention_has_bf16_products())
    assert torch.equal(asked_bf16, expected)
    # k of another dtype than q: the kernel refuses it, so the op asks torch
    mixed = ops.prefill_attention(q, k.bfloat16(), v.bfloat16(), scale, mask)
    assert torch.allclose(
        mixed, ops.prefill_attention_torch(q, k.bfloat16(), v.bfloat16(), scale, mask)
    )
