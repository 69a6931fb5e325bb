"""The GPU's fused norm, rotary, KV write and SiLU kernels against torch's ops.

Without a GPU they run in Triton's interpreter (tests/conftest.py sets it), so CI checks
their indexing and rounding; on a GPU (make test-gpu) the same tests run on CUDA.
"""

from __future__ import annotations

import os

import pytest
import torch

from shared.model import ops

pytestmark = pytest.mark.triton
pytest.importorskip("triton", reason="Triton is not installed (it comes with the dev extra)")
assert torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"  # conftest.py
from shared.model import triton_ops  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# float32 equals torch up to a sum's order; bfloat16 rounds where torch does, so it is
# within one rounding of torch's (rsqrt and exp differ in their last bits).
DTYPES = [torch.float32] + ([torch.bfloat16] if DEVICE == "cuda" else [])


def close(got: torch.Tensor, expected: torch.Tensor) -> None:
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    else:
        torch.testing.assert_close(got.float(), expected.float(), rtol=1e-2, atol=1e-2)


def randn(*shape, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(*shape, device=DEVICE).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [64, 576, 100])  # SmolLM2's width; one no power of two
def test_norms_match_torch(dtype, width):
    torch.manual_seed(0)
    x, residual, weight = randn(5, width, dtype=dtype), randn(5, width, dtype=dtype), randn(width)
    weight = weight.to(dtype)
    close(triton_ops.rms_norm(x, weight, 1e-5), ops.rms_norm_torch(x, weight, 1e-5))
    expected_norm, expected_residual = ops.rms_norm_torch(x + residual, weight, 1e-5), x + residual
    triton_ops.add_rms_norm_(x, residual, weight, 1e-5)  # both in place
    close(residual, expected_residual)
    close(x, expected_norm)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("num_heads", "head_dim"), [(12, 64), (5, 24)])
def test_rotary_matches_torch(dtype, num_heads, head_dim):
    torch.manual_seed(1)
    rotated_heads, width = num_heads - 2, num_heads * head_dim + 16  # v heads stay as they are
    qkv = randn(7, width, dtype=dtype)
    angles = torch.rand(7, head_dim // 2, device=DEVICE) * 6
    cos, sin = angles.cos(), angles.sin()
    expected = qkv.clone()
    ops.rotary_torch_(expected, cos, sin, rotated_heads, head_dim)
    triton_ops.rotary_(qkv, cos, sin, rotated_heads, head_dim)
    close(qkv, expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_matches_torch(dtype):
    torch.manual_seed(2)
    gate_up = randn(3, 2 * 1500, dtype=dtype) * 4  # past one program's 1024 columns
    gate, up = gate_up.chunk(2, dim=-1)
    close(triton_ops.silu_and_mul(gate_up), torch.nn.functional.silu(gate) * up)


def test_write_kv_writes_its_slots_and_skips_negative_ones():
    torch.manual_seed(3)
    k_cache, v_cache = (torch.zeros(4, 8, 3, 16, device=DEVICE) for _ in "kv")
    k, v = randn(3, 3, 16), randn(3, 3, 16)
    slots = torch.tensor([13, -1, 30], device=DEVICE)  # the middle row is padding
    triton_ops.write_kv(k, v, k_cache, v_cache, slots)
    flat_k, flat_v = k_cache.flatten(0, 1), v_cache.flatten(0, 1)
    torch.testing.assert_close(flat_k[[13, 30]], k[[0, 2]], rtol=0, atol=0)
    torch.testing.assert_close(flat_v[[13, 30]], v[[0, 2]], rtol=0, atol=0)
    written = torch.zeros(32, dtype=torch.bool, device=DEVICE)
    written[[13, 30]] = True
    assert not flat_k[~written].any() and not flat_v[~written].any()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "k"), [(72, 576), (50, 100)])  # bands and columns partly filled
def test_gemv_matches_torch(dtype, n, k):
    torch.manual_seed(4)
    x, weight, bias = randn(1, k, dtype=dtype), randn(n, k, dtype=dtype), randn(n, dtype=dtype)
    close(triton_ops.gemv(x, weight, None), torch.nn.functional.linear(x, weight))
    close(triton_ops.gemv(x, weight, bias), torch.nn.functional.linear(x, weight, bias))
