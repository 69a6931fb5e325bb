"""The model's small fused steps: native CPU kernels where built, torch otherwise.

The torch version of each op is the reference; the native one must match it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from shared.model.kernels import chosen_isa, cpu_ops


def _native(x: torch.Tensor):
    return cpu_ops() if x.device.type == "cpu" else None


def _gpu(x: torch.Tensor):
    """The Triton kernels (shared/model/triton_ops.py) for a CUDA tensor where Triton is
    installed; None elsewhere (torch's ops)."""
    return _triton_ops() if x.is_cuda else None


@functools.cache
def _triton_ops():
    try:
        from shared.model import triton_ops
    except ImportError:  # a CUDA torch without Triton: torch's ops
        return None
    return triton_ops


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    native = _native(x)
    if native is not None and x.is_contiguous():
        out = torch.empty_like(x)
        native.rms_norm(out, x, weight, eps)
        return out
    gpu = _gpu(x)
    if gpu is not None and x.dim() == 2 and x.stride(1) == 1:
        return gpu.rms_norm(x, weight, eps)
    return rms_norm_torch(x, weight, eps)


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)
    # NOTE: reduced precision normalizes in float32, then scales in the input dtype (as HF).
    return weight * F.rms_norm(x.float(), weight.shape, None, eps).to(x.dtype)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """residual + x becomes the new residual; returns (its norm, the new residual)."""
    native = _native(x)
    if native is not None and x.is_contiguous() and residual.is_contiguous():
        native.add_rms_norm_(x, residual, weight, eps)
        return x, residual
    gpu = _gpu(x)
    if gpu is not None and x.dim() == 2 and x.stride(1) == 1 and residual.stride(1) == 1:
        gpu.add_rms_norm_(x, residual, weight, eps)
        return x, residual
    residual = x + residual
    return rms_norm_torch(residual, weight, eps), residual


# NOTE: the most rows of x for which the native GEMV (it streams the weight once, at memory
# bandwidth) beats torch's F.linear, per instruction set and dtype; beyond them the library
# GEMM's cache blocking wins. From `python -m bench gemv --threads 1` on SmolLM2-135M's shapes
# (docs/benchmarks.md: an AMD EPYC with AVX-512, shared and noisy, so one thread and the
# fastest of many calls); float16 was not measured and follows bfloat16. 0: always torch.
GEMV_MAX_ROWS: dict[str | None, dict[torch.dtype, int]] = {
    "avx512": {torch.float32: 8, torch.bfloat16: 4, torch.float16: 4},
    "avx2": {torch.float32: 6, torch.bfloat16: 2, torch.float16: 2},
    # On a GPU, the Triton GEMV (shared/model/triton_ops.py) takes one half-width row;
    # float32 stays with cuBLAS (IEEE sums, for parity with transformers).
    # NOTE: measured against cuBLAS with `python -m bench engine --device cuda --before
    # cublas` (docs/benchmarks.md, "The engine on a GPU").
    "cuda": {torch.bfloat16: 1, torch.float16: 1},
}
_gemv_override: dict[torch.dtype, int] | None = None


def gemv_max_rows(dtype: torch.dtype, device_type: str = "cpu") -> int:
    if _gemv_override is not None:
        return _gemv_override.get(dtype, 0)
    key = chosen_isa() if device_type == "cpu" else device_type
    return GEMV_MAX_ROWS.get(key, {}).get(dtype, 0)


@contextlib.contextmanager
def gemv_rows(limits: dict[torch.dtype, int]) -> Iterator[None]:
    """Route matmuls by these limits instead (benchmarks: the routing before them)."""
    global _gemv_override
    previous, _gemv_override = _gemv_override, limits
    try:
        yield
    finally:
        _gemv_override = previous


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    native = _native(x)
    if (
        native is not None
        and x.dim() == 2
        and x.shape[0] <= gemv_max_rows(x.dtype)
        and x.dtype == weight.dtype
        and weight.is_contiguous()
    ):
        out = x.new_empty(x.shape[0], weight.shape[0])
        native.small_linear(out, x.contiguous(), weight, bias)
        return out
    gpu = _gpu(x)
    if (
        gpu is not None
        and x.dim() == 2
        and x.shape[0] == 1
        and gemv_max_rows(x.dtype, "cuda") >= 1
        and x.dtype == weight.dtype
        and x.stride(1) == 1
        and weight.stride(1) == 1
    ):
        return gpu.gemv(x, weight, bias)
    return F.linear(x, weight, bias)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    native = _native(gate_up)
    # NOTE: one pass where torch makes two and a temporary: ahead of torch's in float32, and
    # in bfloat16 over a prefill chunk's rows too (the MLP's bfloat16 prefill, layers.py).
    if native is not None and gate_up.is_contiguous():
        out = gate_up.new_empty(gate_up.shape[0], gate_up.shape[1] // 2)
        native.silu_and_mul(out, gate_up)
        return out
    gpu = _gpu(gate_up)
    if gpu is not None and gate_up.dim() == 2 and gate_up.stride(1) == 1:
        return gpu.silu_and_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def rotary_(
    qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int, head_dim: int
) -> None:
    """Rotate the first `num_heads` heads of each row of qkv [T, width] in place.

    cos, sin: float32 [T, head_dim / 2] (rotate-half layout: dims i and i + D/2 pair up).
    """
    native = _native(qkv)
    if native is not None and qkv.stride(1) == 1:
        native.rotary_(qkv, cos, sin, num_heads, head_dim)
        return
    gpu = _gpu(qkv)
    if gpu is not None and qkv.stride(1) == 1 and cos.stride(1) == 1 and sin.stride(1) == 1:
        gpu.rotary_(qkv, cos, sin, num_heads, head_dim)
        return
    rotary_torch_(qkv, cos, sin, num_heads, head_dim)


def rotary_torch_(
    qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int, head_dim: int
) -> None:
    x = qkv[:, : num_heads * head_dim].view(qkv.shape[0], num_heads, head_dim)
    full_cos = torch.cat((cos, cos), dim=-1)[:, None, :].to(qkv.dtype)
    full_sin = torch.cat((sin, sin), dim=-1)[:, None, :].to(qkv.dtype)
    half = head_dim // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    x.copy_(x * full_cos + rotated * full_sin)


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    """k, v [T, H_kv, D] into caches [blocks, block_size, H_kv, D] at flat slot indices."""
    native = _native(k)
    if native is not None and k.stride(1) == k.shape[2] and k.stride(2) == 1:
        native.write_kv(k, v, k_cache, v_cache, slots)
        return
    gpu = _gpu(k)
    if gpu is not None and k.stride(2) == 1 and v.stride(2) == 1 and k_cache.stride(3) == 1:
        gpu.write_kv(k, v, k_cache, v_cache, slots)
        return
    k_cache.flatten(0, 1).index_copy_(0, slots, k)
    v_cache.flatten(0, 1).index_copy_(0, slots, v)


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query token per sequence, q [B, H, D], over its blocks; returns [B, H, D]."""
    native = _native(q)
    if native is not None and q.stride(1) == q.shape[2] and q.stride(2) == 1:
        out = q.new_empty(q.shape)
        native.decode_attention(out, q, k_cache, v_cache, block_table, context_lens, scale)
        return out
    return decode_attention_torch(q, k_cache, v_cache, block_table, context_lens, scale)


def prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    mask: torch.Tensor | None = None,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Causal attention of a prompt chunk, q [T, H, D], over its context k, v [L, H_kv, D]
    whose last T rows are the chunk's own: query i sees keys up to L - T + i. The native
    kernel sums in float32, its products rounded to bfloat16 where `dtype` (default q's) is
    bfloat16 and the CPU multiplies bfloat16 pairs natively (AVX512-BF16), else float32;
    torch's attends in `dtype` under `mask` (causal_mask(T, L), which the caller builds once
    per step; None: L == T, plain causal)."""
    native = _native(q)
    if native is not None and q.dtype == k.dtype == v.dtype and _heads_contiguous(q, k, v):
        out = q.new_empty(q.shape)
        native.prefill_attention(out, q, k, v, scale, (dtype or q.dtype) == torch.bfloat16)
        return out
    return prefill_attention_torch(q, k, v, scale, mask, dtype)


def prefill_attention_torch(q, k, v, scale, mask=None, dtype=None):
    # NOTE: 4-D inputs reach torch's fused CPU kernel; 3-D ones fall back to the slow path.
    # In bfloat16 that kernel takes a third of float32's time from 512 tokens on (AMX).
    as_4d = lambda x: x.transpose(0, 1).unsqueeze(0).to(dtype or q.dtype)
    out = F.scaled_dot_product_attention(
        as_4d(q),
        as_4d(k),
        as_4d(v),
        attn_mask=mask,
        is_causal=mask is None,
        scale=scale,
        enable_gqa=True,
    )
    return out[0].transpose(0, 1).to(q.dtype)


def _heads_contiguous(*tensors: torch.Tensor) -> bool:
    return all(t.stride(2) == 1 and t.stride(1) == t.shape[2] for t in tensors)


def decode_attention_torch(q, k_cache, v_cache, block_table, context_lens, scale):
    num_seqs, num_heads, head_dim = q.shape
    # index_select on a flat table is much faster on CPU than 2-D advanced indexing.
    gather = lambda cache: (
        cache.index_select(0, block_table.flatten())
        .view(num_seqs, -1, *cache.shape[2:])
        .transpose(1, 2)
    )  # [B, H_kv, L, D]
    keys, values = gather(k_cache), gather(v_cache)
    visible = torch.arange(keys.shape[2], device=q.device)
    mask = (visible[None, :] < context_lens[:, None])[:, None, None, :]
    out = F.scaled_dot_product_attention(
        q.unsqueeze(2), keys, values, attn_mask=mask, scale=scale, enable_gqa=True
    )
    return out.view(num_seqs, num_heads, head_dim)
