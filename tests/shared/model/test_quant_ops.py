"""Kernels on GGUF blocks against the gguf package's dequantization, on every ISA build."""

from __future__ import annotations

import pytest
import torch

from shared.model.quant_formats import (
    FORMATS,
    QuantFormat,
    dequantize,
    quantize,
    random_blocks,
)

# NOTE: the kernels sum in a different order than the reference matmul; float32 rounding only.
TOLERANCE = 1e-4


def reference(x: torch.Tensor, blocks: torch.Tensor, fmt: QuantFormat, bias=None):
    return torch.nn.functional.linear(x.double(), dequantize(blocks, fmt).double(), bias)


def assert_close(out: torch.Tensor, expected: torch.Tensor) -> None:
    err = (out.double() - expected).abs().max().item()
    assert err <= TOLERANCE * max(1.0, expected.abs().max().item()), err


# Row lengths: one block, several, and (for Q4_K) super-blocks; row counts with tails.
SHAPES = [(1, 37, 256), (2, 16, 512), (3, 5, 768), (4, 64, 256), (7, 33, 1536)]


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize(("rows", "out_features", "in_features"), SHAPES)
def test_gemv_matches_the_dequantized_weight(kernels, name, rows, out_features, in_features):
    fmt = FORMATS[name]
    blocks = random_blocks(fmt, out_features, in_features, seed=rows)
    x = torch.randn(rows, in_features)
    out = torch.empty(rows, out_features)
    kernels.quant_gemv(out, x, blocks, fmt.ggml_type, None)
    assert_close(out, reference(x, blocks, fmt))


@pytest.mark.parametrize("name", FORMATS)
def test_a_row_of_x_sums_alike_alone_and_among_others(kernels, name):
    """Batch invariance: one row of x (its weight rows taken four at a time, a tail of 37 % 4
    alone) gives bit for bit what it gives among other rows of x (which share each weight)."""
    fmt = FORMATS[name]
    blocks = random_blocks(fmt, 37, 512, seed=11)
    x, bias = torch.randn(4, 512), torch.randn(37)
    together = torch.empty(4, 37)
    kernels.quant_gemv(together, x, blocks, fmt.ggml_type, bias)
    for m in range(4):
        alone = torch.empty(1, 37)
        kernels.quant_gemv(alone, x[m : m + 1].contiguous(), blocks, fmt.ggml_type, bias)
        assert torch.equal(alone[0], together[m]), m
    assert_close(together, reference(x, blocks, fmt, bias.double()))


@pytest.mark.parametrize("name", FORMATS)
def test_gemm_with_bias_and_a_partial_last_tile(kernels, name):
    fmt = FORMATS[name]
    blocks = random_blocks(fmt, 70, 512, seed=1)
    x, bias = torch.randn(19, 512), torch.randn(70)
    out = torch.empty(19, 70)
    kernels.quant_gemm(out, x, blocks, fmt.ggml_type, bias, 32)
    assert_close(out, reference(x, blocks, fmt, bias.double()))


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_gemm_tiles_shared_among_threads_in_inference_mode(kernels, threads):
    """Each thread takes whole tiles; the last tile is short and there are more tiles than
    threads (the engine calls it under inference mode, which its worker threads need too)."""
    fmt = FORMATS["q4_1"]
    blocks = random_blocks(fmt, 200, 256, seed=3)
    x = torch.randn(21, 256)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            out = torch.empty(21, 200)
            kernels.quant_gemm(out, x, blocks, fmt.ggml_type, None, 48)
    finally:
        torch.set_num_threads(before)
    assert_close(out, reference(x, blocks, fmt))


@pytest.mark.parametrize("name", FORMATS)
def test_dequantize_is_exactly_the_gguf_package(kernels, name):
    fmt = FORMATS[name]
    blocks = random_blocks(fmt, 9, 512, seed=2)
    out = torch.empty(9, 512)
    kernels.quant_dequantize(out, blocks, fmt.ggml_type)
    torch.testing.assert_close(out, dequantize(blocks, fmt), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", FORMATS)
def test_dequantize_to_bf16_rounds_as_torch_does(kernels, name):
    fmt = FORMATS[name]
    blocks = random_blocks(fmt, 9, 512, seed=4)
    out = torch.empty(9, 512, dtype=torch.bfloat16)
    kernels.quant_dequantize(out, blocks, fmt.ggml_type)
    exact = torch.empty(9, 512)
    kernels.quant_dequantize(exact, blocks, fmt.ggml_type)
    assert torch.equal(out, exact.to(torch.bfloat16))  # round to nearest even, bit for bit


def test_dequantize_refuses_other_out_dtypes(kernels):
    fmt = FORMATS["q8_0"]
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        kernels.quant_dequantize(
            torch.empty(2, 64, dtype=torch.float16),
            quantize(torch.randn(2, 64), fmt),
            fmt.ggml_type,
        )


def test_gemv_bias_is_added(kernels):
    fmt = FORMATS["q8_0"]
    blocks = quantize(torch.randn(12, 64), fmt)
    x, bias = torch.randn(1, 64), torch.randn(12)
    out = torch.empty(1, 12)
    kernels.quant_gemv(out, x, blocks, fmt.ggml_type, bias)
    assert_close(out, reference(x, blocks, fmt, bias.double()))


def test_a_row_length_the_format_cannot_hold_is_refused(kernels):
    fmt = FORMATS["q4_k"]
    blocks = torch.zeros(4, fmt.block_bytes, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="do not hold"):
        kernels.quant_gemv(torch.empty(1, 4), torch.randn(1, 128), blocks, fmt.ggml_type, None)
    with pytest.raises(ValueError, match="multiple of 256"):
        fmt.row_bytes(576)


# ---- 8- and 16-bit activations: integer dot products (quant_dot.cpp) ----------------------
def rounded(x: torch.Tensor, bits: int) -> torch.Tensor:
    """x as the kernel quantizes it: per block of 32, d = max|x| / (2^(bits-1) - 1),
    q = round(x / d)."""
    blocks = x.reshape(x.shape[0], -1, 32)
    d = blocks.abs().amax(-1, keepdim=True) / (2 ** (bits - 1) - 1)
    inverse = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    return (torch.round(blocks * inverse) * d).reshape(x.shape)


BITS = pytest.mark.parametrize("bits", [8, 16])


# NOTE: integer products are exact, so the SIMD and portable paths differ from the reference
# on x rounded to 8 or 16 bits only in float sums; x's rounding itself costs about 1% at 8
# bits (below).
@pytest.mark.parametrize("portable", [False, True], ids=["simd", "portable"])
@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize(("rows", "out_features", "in_features"), SHAPES)
@BITS
def test_int_gemv_is_the_dequantized_weight_times_x_rounded_to_its_bits(
    kernels, portable, name, rows, out_features, in_features, bits
):
    fmt = FORMATS[name]
    blocks = random_blocks(fmt, out_features, in_features, seed=rows)
    x, bias = torch.randn(rows, in_features), torch.randn(out_features)
    out = torch.empty(rows, out_features)
    kernels.quant_gemv_int(out, x, blocks, fmt.ggml_type, bias, bits, portable)
    assert_close(out, reference(rounded(x, bits), blocks, fmt, bias.double()))


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize(("bits", "most"), [(8, 0.02), (16, 1e-4)])
def test_int_gemv_is_near_float_activations(kernels, name, bits, most):
    fmt = FORMATS[name]
    blocks = random_blocks(fmt, 64, 512, seed=4)
    x = torch.randn(3, 512)
    out = torch.empty(3, 64)
    kernels.quant_gemv_int(out, x, blocks, fmt.ggml_type, None, bits, False)
    expected = reference(x, blocks, fmt)
    error = (out.double() - expected).norm() / expected.norm()
    assert 0 < error < most, error  # rounded, but only by x's 8 or 16 bits


@BITS
def test_int_gemv_of_zero_rows_and_an_odd_number_of_blocks(kernels, bits):
    fmt = FORMATS["q4_1"]
    blocks = random_blocks(fmt, 9, 96, seed=3)  # 3 blocks: a pair and a single
    x = torch.randn(2, 96)
    x[1] = 0.0
    out = torch.empty(2, 9)
    kernels.quant_gemv_int(out, x, blocks, fmt.ggml_type, None, bits, False)
    assert_close(out, reference(rounded(x, bits), blocks, fmt))


@BITS
def test_rows_are_rounded_for_prefill_as_the_int_gemv_rounds_them(kernels, bits):
    x = torch.randn(5, 96) * torch.logspace(-3, 3, 96)  # blocks of every magnitude
    x[2] = 0.0
    out = torch.empty_like(x)
    kernels.quant_round_rows(out, x, bits)
    torch.testing.assert_close(out, rounded(x, bits), rtol=1e-6, atol=0)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        kernels.quant_round_rows(torch.empty(1, 40), torch.randn(1, 40), bits)


@BITS
def test_a_nan_anywhere_in_a_row_of_x_makes_that_row_nan(kernels, bits):
    """The block's maximum skips a NaN (the vector max keeps whichever operand comes second),
    and rounding would make some integer of it: the row's scales are made NaN instead, so the
    row is NaN wherever the NaN sits, as a float matmul would make it; other rows round as
    they did."""
    x = torch.randn(2, 64) * 5
    want = torch.empty_like(x)
    kernels.quant_round_rows(want, x, bits)
    for at in (0, 7, 31, 45):  # a NaN first, inside a vector, last, in the second block
        with_nan = x.clone()
        with_nan[1, at] = float("nan")
        got = torch.empty_like(x)
        kernels.quant_round_rows(got, with_nan, bits)
        assert got[1].isnan().all() and torch.equal(got[0], want[0]), at


def test_int_gemv_refuses_bad_input(kernels):
    fmt = FORMATS["q8_0"]
    blocks = quantize(torch.randn(8, 64), fmt)
    with pytest.raises(RuntimeError, match="float32"):
        kernels.quant_gemv_int(
            torch.empty(1, 8), torch.randn(1, 64).double(), blocks, 8, None, 8, False
        )
    with pytest.raises(RuntimeError, match="bias"):
        bias = torch.randn(7)
        kernels.quant_gemv_int(torch.empty(1, 8), torch.randn(1, 64), blocks, 8, bias, 8, False)
    with pytest.raises(RuntimeError, match="do not hold"):
        kernels.quant_gemv_int(torch.empty(1, 8), torch.randn(1, 96), blocks, 8, None, 8, False)
    with pytest.raises(RuntimeError, match="bits: 8 or 16, got 4"):
        kernels.quant_gemv_int(torch.empty(1, 8), torch.randn(1, 64), blocks, 8, None, 4, False)


@pytest.mark.parametrize("name", FORMATS)
def test_prefetching_ahead_changes_no_result(kernels, name):
    fmt = FORMATS[name]
    blocks = random_blocks(fmt, 64, 512, seed=5)
    x = torch.randn(3, 512)
    results = []
    default = kernels.set_weight_prefetch(0)
    try:
        for distance in (0, 64, default):
            kernels.set_weight_prefetch(distance)
            outs = [torch.empty(3, 64) for _ in range(3)]
            kernels.quant_gemv(outs[0], x, blocks, fmt.ggml_type, None)
            kernels.quant_gemv_int(outs[1], x, blocks, fmt.ggml_type, None, 8, False)
            kernels.quant_gemv_int(outs[2], x, blocks, fmt.ggml_type, None, 16, False)
            results.append(outs)
    finally:
        assert kernels.set_weight_prefetch(default) == default
    assert default > 0  # the kernels prefetch unless told not to
    for outs in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(outs, results[0], strict=True))
    with pytest.raises(RuntimeError, match="0 or more bytes"):
        kernels.set_weight_prefetch(-1)
