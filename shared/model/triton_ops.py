"""The model's small steps on a GPU, each one Triton kernel instead of a chain of torch ops.

A decode step on a GPU is launch-bound: torch runs RMSNorm with its residual add as five
kernels, rotary as about ten, SiLU-and-multiply as three. These kernels do each in one
launch and round where torch rounds (every bfloat16 product and sum, as the torch reference
in shared/model/ops.py computes them), so their outputs equal torch's up to the order of a
float32 sum. Without a GPU they run in Triton's interpreter (`TRITON_INTERPRET=1`), which
is how CI checks them.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


def add_rms_norm_(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    """residual += x, then x = norm(residual) * weight, both in place; rows [T, hidden]."""
    _norm(x, residual, x, weight, eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    out = torch.empty_like(x)
    _norm(x, None, out, weight, eps)
    return out


def _norm(x, residual, out, weight, eps) -> None:
    rows, width = x.shape
    _norm_kernel[(rows,)](
        x,
        residual if residual is not None else x,
        out,
        weight,
        width,
        x.stride(0),
        residual.stride(0) if residual is not None else 0,
        out.stride(0),
        eps,
        HAS_RESIDUAL=residual is not None,
        BLOCK=triton.next_power_of_2(width),
    )


def rotary_(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int, head_dim: int):
    """Rotate the first `num_heads` heads of each row of qkv [T, width] in place; cos, sin
    float32 [T, head_dim / 2] (rotate-half layout), rounded to qkv's dtype as torch does."""
    half = head_dim // 2
    _rotary_kernel[(qkv.shape[0],)](
        qkv,
        cos,
        sin,
        qkv.stride(0),
        cos.stride(0),
        sin.stride(0),
        num_heads,
        half,
        BLOCK_HEADS=triton.next_power_of_2(num_heads),
        BLOCK_HALF=triton.next_power_of_2(half),
    )


def write_kv(k, v, k_cache, v_cache, slots: torch.Tensor) -> None:
    """k, v [T, H_kv, D] into caches [blocks, block_size, H_kv, D] at flat slots; a
    negative slot is skipped (the padding rows of a CUDA graph's batch)."""
    num_kv_heads, head_dim = k.shape[1], k.shape[2]
    _write_kv_kernel[(k.shape[0],)](
        k,
        v,
        k_cache,
        v_cache,
        slots,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.shape[1],
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        num_kv_heads,
        head_dim,
        BLOCK_HEADS=triton.next_power_of_2(num_kv_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
    )


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [T, 2I] -> silu(gate) * up [T, I]."""
    rows, width = gate_up.shape
    out = gate_up.new_empty(rows, width // 2)
    block = 1024
    _silu_and_mul_kernel[(rows, triton.cdiv(width // 2, block))](
        gate_up, out, width // 2, gate_up.stride(0), out.stride(0), BLOCK=block
    )
    return out


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [1, K] @ weight [N, K].T (+ bias): each program streams a band of the weight once,
    accumulating in float32 (cuBLAS's kernels for one row leave part of the bandwidth
    unused on a decode step's small matrices)."""
    if x.shape[0] != 1:
        raise ValueError("the Triton GEMV takes one row")
    out = x.new_empty(1, weight.shape[0])
    grid = lambda meta: (triton.cdiv(weight.shape[0], meta["BLOCK_N"]),)
    args = (x, weight, bias if bias is not None else weight, out, weight.shape[0], x.shape[1])
    if os.environ.get("TRITON_INTERPRET") == "1":  # no GPU to tune on: one fixed tile
        _gemv_kernel[grid](*args, weight.stride(0), bias is not None, BLOCK_N=16, BLOCK_K=256)
    else:
        _tuned_gemv[grid](*args, weight.stride(0), HAS_BIAS=bias is not None)
    return out


def _gemv_configs() -> list[triton.Config]:
    return [
        triton.Config({"BLOCK_N": n, "BLOCK_K": k}, num_warps=w, num_stages=s)
        for n, k, w, s in (
            (8, 512, 4, 3),
            (16, 256, 4, 3),
            (16, 512, 4, 3),
            (32, 256, 4, 3),
            (32, 256, 8, 4),
            (64, 128, 4, 4),
            (16, 1024, 8, 2),
        )
    ]


@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    N,
    K,
    stride_w,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    band = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_K)
    in_band = band < N
    acc = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, K, BLOCK_K):
        k = start + cols
        w = tl.load(
            w_ptr + band[:, None] * stride_w + k[None, :],
            mask=in_band[:, None] & (k < K)[None, :],
            other=0.0,
        )
        xk = tl.load(x_ptr + k, mask=k < K, other=0.0)
        acc += tl.sum(w.to(tl.float32) * xk.to(tl.float32)[None, :], axis=1)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + band, mask=in_band, other=0.0).to(tl.float32)
    tl.store(out_ptr + band, acc.to(out_ptr.dtype.element_ty), mask=in_band)


# Tile and warps per weight shape, picked by timing each config once at the shape's first
# call (in a CUDA graph's warm-up pass, before any capture).
_tuned_gemv = triton.autotune(configs=_gemv_configs(), key=["N", "K"])(_gemv_kernel)


@triton.jit
def _rounded(x, like):
    """x (float32) rounded to the dtype of `like`'s pointer and widened back: where torch
    keeps an intermediate result in the input dtype, so do these kernels."""
    return x.to(like.dtype.element_ty).to(tl.float32)


@triton.jit
def _norm_kernel(
    x_ptr,
    res_ptr,
    out_ptr,
    w_ptr,
    width,
    stride_x,
    stride_r,
    stride_o,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < width
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        x = _rounded(x + r, res_ptr)  # the new residual, in the stream's dtype
        tl.store(res_ptr + row * stride_r + cols, x.to(res_ptr.dtype.element_ty), mask=mask)
    mean_square = tl.sum(x * x, axis=0) / width
    normed = _rounded(x * tl.rsqrt(mean_square + eps), out_ptr)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (normed * w).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(
    qkv_ptr,
    cos_ptr,
    sin_ptr,
    stride_t,
    stride_cos,
    stride_sin,
    num_heads,
    half,
    BLOCK_HEADS: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    heads = tl.arange(0, BLOCK_HEADS)[:, None]
    dims = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (heads < num_heads) & (dims < half)
    first = qkv_ptr + token * stride_t + heads * (2 * half) + dims
    x1 = tl.load(first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(first + half, mask=mask, other=0.0).to(tl.float32)
    c = _rounded(tl.load(cos_ptr + token * stride_cos + dims, mask=dims < half, other=0.0), qkv_ptr)
    s = _rounded(tl.load(sin_ptr + token * stride_sin + dims, mask=dims < half, other=0.0), qkv_ptr)
    # rotate half: (x1, x2) -> (x1 c - x2 s, x2 c + x1 s), each product rounded as torch's
    out1 = _rounded(x1 * c, qkv_ptr) - _rounded(x2 * s, qkv_ptr)
    out2 = _rounded(x2 * c, qkv_ptr) + _rounded(x1 * s, qkv_ptr)
    tl.store(first, out1.to(qkv_ptr.dtype.element_ty), mask=mask)
    tl.store(first + half, out2.to(qkv_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _write_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slots_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    block_size,
    stride_cb,
    stride_ct,
    stride_ch,
    num_kv_heads,
    head_dim,
    BLOCK_HEADS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + token + tl.zeros([1, 1], tl.int64))  # [1, 1]: broadcasts
    heads = tl.arange(0, BLOCK_HEADS)[:, None]
    dims = tl.arange(0, BLOCK_D)[None, :]
    mask = (heads < num_kv_heads) & (dims < head_dim) & (slot >= 0)
    at = (slot // block_size) * stride_cb + (slot % block_size) * stride_ct + heads * stride_ch
    k = tl.load(k_ptr + token * stride_kt + heads * stride_kh + dims, mask=mask)
    v = tl.load(v_ptr + token * stride_vt + heads * stride_vh + dims, mask=mask)
    tl.store(k_cache_ptr + at + dims, k, mask=mask)
    tl.store(v_cache_ptr + at + dims, v, mask=mask)


@triton.jit
def _silu_and_mul_kernel(in_ptr, out_ptr, width, stride_in, stride_out, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    gate = tl.load(in_ptr + row * stride_in + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(in_ptr + row * stride_in + width + cols, mask=mask, other=0.0).to(tl.float32)
    silu = _rounded(gate / (1.0 + tl.exp(-gate)), in_ptr)
    tl.store(out_ptr + row * stride_out + cols, (silu * up).to(out_ptr.dtype.element_ty), mask=mask)
