"""The multi-row bfloat16 path of quantized linears (prefill chunks in bfloat16, and float32
ones where the layer's prefill dtype is bfloat16) against the dequantized weight, and float32
rows kept off it otherwise; the prefill copies (bfloat16 and float32) against dequantizing on
every pass."""

from __future__ import annotations

import pytest
import torch

from shared.model import quant
from shared.model.kernels import cpu_ops
from shared.model.quant import PREFILL_GEMM_MIN_ROWS, QuantLinear
from shared.model.quant_formats import FORMATS, dequantize, random_blocks

pytestmark = pytest.mark.skipif(cpu_ops() is None, reason="no native kernels on this CPU")


def layer(name: str, out_features: int, in_features: int) -> QuantLinear:
    fmt = FORMATS[name]
    bias = torch.nn.Parameter(torch.randn(out_features), requires_grad=False)
    return QuantLinear(
        random_blocks(fmt, out_features, in_features, seed=3), fmt, in_features, bias
    )


def reference(linear: QuantLinear, x: torch.Tensor) -> torch.Tensor:
    weight = dequantize(linear.gguf_blocks(), linear.fmt).double()
    return torch.nn.functional.linear(x.double(), weight, linear.bias.double())


@pytest.mark.parametrize("name", FORMATS)
def test_bf16_rows_match_the_dequantized_weight_to_bf16_rounding(name) -> None:
    linear = layer(name, 300, 512)  # a partial last tile of weight rows
    x = torch.randn(2, PREFILL_GEMM_MIN_ROWS, 512).bfloat16()
    out = linear(x)
    assert out.dtype == torch.bfloat16 and out.shape == (2, PREFILL_GEMM_MIN_ROWS, 300)
    expected = reference(linear, x)
    # NOTE: bfloat16 keeps 8 bits of mantissa: weights and outputs rounded, sums in float32.
    assert (out.double() - expected).abs().max() <= 2e-2 * expected.abs().max()


def test_a_weight_past_the_bound_multiplies_in_parts(monkeypatch) -> None:
    linear = layer("q4_1", 300, 512)
    x = torch.randn(PREFILL_GEMM_MIN_ROWS, 512).bfloat16()
    whole = linear(x)
    monkeypatch.setattr(quant, "GEMM_TILE_ROWS", 16)
    monkeypatch.setattr(quant, "BF16_WEIGHT_VALUES", 128 * 512)  # parts of 128, 128 and 44 rows
    parts = linear(x)
    # NOTE: each output column is one row of the weight times x, whichever part holds it (the
    # library may block a smaller GEMM differently: its last bit may differ).
    assert (parts.double() - whole.double()).abs().max() <= 1e-2 * whole.double().abs().max()


@pytest.mark.parametrize("activations", ["float", "q16"])
def test_float32_rows_take_it_where_the_prefill_dtype_is_bf16_and_stay_float32(
    activations,
) -> None:
    linear = layer("q4_1", 300, 512)
    quant.set_activations(torch.nn.Sequential(linear), activations)
    x = torch.randn(PREFILL_GEMM_MIN_ROWS, 512)
    exact = linear(x)
    quant.set_prefill_dtype(torch.nn.Sequential(linear), torch.bfloat16)
    out = linear(x)
    expected = reference(linear, x)
    assert out.dtype == torch.float32 and out.shape == exact.shape
    assert not torch.equal(out, exact)  # it did round to bfloat16
    assert (out.double() - expected).abs().max() <= 2e-2 * expected.abs().max()
    decode_rows = x[: quant.GEMV_MAX_ROWS]  # a decode step's rows stay on the float32 GEMV
    assert (linear(decode_rows).double() - reference(linear, decode_rows)).abs().max() <= 1e-3


def test_a_prefill_dtype_other_than_float32_or_bf16_is_refused() -> None:
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        quant.set_prefill_dtype(torch.nn.Sequential(layer("q8_0", 64, 256)), torch.float16)


def test_float32_rows_never_take_the_bf16_path(monkeypatch) -> None:
    linear = layer("q8_0", 64, 256)
    monkeypatch.setattr(QuantLinear, "linear_bf16", None)  # would raise if called
    x = torch.randn(PREFILL_GEMM_MIN_ROWS * 2, 256)
    assert (linear(x).double() - reference(linear, x)).abs().max() <= 1e-3
    # q8 activations: not even where the prefill dtype is bfloat16 (prefill rounds as decode)
    quant.set_activations(torch.nn.Sequential(linear), "q8")
    quant.set_prefill_dtype(torch.nn.Sequential(linear), torch.bfloat16)
    assert linear(x).dtype == torch.float32
    assert quant.GEMV_MAX_ROWS < PREFILL_GEMM_MIN_ROWS  # decode rows stay on the GEMV


def packings(dtype: torch.dtype) -> list[bool]:
    """The copy's layouts this machine has: plain always, oneDNN's packed where torch can."""
    return [False, True] if quant.can_pack(dtype) else [False]


@pytest.mark.parametrize("packed", packings(torch.bfloat16))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_kept_bf16_copy_multiplies_many_rows_and_decode_rows_still_read_the_blocks(
    packed, dtype
) -> None:
    linear = layer("q4_1", 300, 512)
    quant.set_prefill_dtype(torch.nn.Sequential(linear), torch.bfloat16)
    x = torch.randn(PREFILL_GEMM_MIN_ROWS + 3, 512).to(dtype)
    dequantized_each_pass = linear(x)
    linear.keep_prefill_copy(torch.bfloat16, packed)
    assert linear.prefill_copy.packed == packed
    assert linear.prefill_copy.nbytes >= 2 * 300 * 512
    out = linear(x)
    assert out.dtype == dtype and out.shape == dequantized_each_pass.shape
    expected = reference(linear, x)
    assert (out.double() - expected).abs().max() <= 2e-2 * expected.abs().max()
    assert_the_copy_takes_many_rows_and_the_blocks_few(linear, x, out)


@pytest.mark.parametrize("packed", packings(torch.float32))
@pytest.mark.parametrize("activations", quant.ACTIVATIONS)
def test_a_kept_float32_copy_multiplies_many_rows_as_the_tiles_do(packed, activations) -> None:
    """Where prompts multiply in float32 (no native bfloat16, or --dtype float32) the copy
    is the dequantized weight itself: the tiles' results up to the order of the sums."""
    linear = layer("q4_1", 300, 512)
    quant.set_activations(torch.nn.Sequential(linear), activations)
    x = torch.randn(PREFILL_GEMM_MIN_ROWS + 3, 512)
    dequantized_each_pass = linear(x)
    linear.keep_prefill_copy(torch.float32, packed)
    assert linear.prefill_copy.packed == packed
    assert linear.prefill_copy.nbytes >= 4 * 300 * 512
    out = linear(x)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, dequantized_each_pass, rtol=1e-5, atol=1e-4)
    assert_the_copy_takes_many_rows_and_the_blocks_few(linear, x, out)


def assert_the_copy_takes_many_rows_and_the_blocks_few(linear, x, out) -> None:
    decode_rows = x[: quant.GEMV_MAX_ROWS].float()
    linear.blocks.zero_()  # from here on only the copy knows the weight
    assert torch.equal(linear(x), out)  # many rows: the copy
    assert torch.count_nonzero(linear(decode_rows) - linear.bias) == 0  # few: the blocks


def test_the_copies_skip_the_output_head_and_say_their_size() -> None:
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList([layer("q8_0", 64, 256), layer("q4_0", 32, 256)])
    model.lm_head = layer("q8_0", 1000, 256)  # an untied head: only the last rows reach it
    assert quant.prefill_copy_bytes(model, torch.bfloat16) == 2 * (64 + 32) * 256
    assert quant.prefill_copy_bytes(model, torch.float32) == 4 * (64 + 32) * 256
    copied = quant.keep_prefill_copies(model, torch.bfloat16)
    assert copied >= quant.prefill_copy_bytes(model, torch.bfloat16)
    assert all(m.prefill_copy is not None for m in model.layers)
    assert model.lm_head.prefill_copy is None


@pytest.mark.parametrize("activations", quant.ACTIVATIONS)
def test_bf16_decode_rows_take_the_gemv_in_float32_and_round_its_result(
    monkeypatch, activations
) -> None:
    """A bfloat16 model's decode rows: widened, the GEMV, rounded back; never the library's
    bfloat16 GEMM (8x slower for one row, even by a kept copy)."""
    linear = layer("q4_1", 300, 512)
    quant.set_activations(torch.nn.Sequential(linear), activations)
    linear.keep_prefill_copy(torch.bfloat16)
    monkeypatch.setattr(QuantLinear, "linear_bf16", None)  # would raise if called
    for rows in (1, min(linear.gemv_max_rows, quant.BF16_COPY_MIN_ROWS - 1)):
        x = torch.randn(rows, 512).bfloat16()
        assert linear.matmul_dtype(x) == torch.float32
        out = linear(x)
        assert out.dtype == torch.bfloat16 and out.shape == (rows, 300)
        assert torch.equal(out, linear.gemv(x.float()).bfloat16())
    many = torch.randn(PREFILL_GEMM_MIN_ROWS, 512).bfloat16()
    assert linear.matmul_dtype(many) == (
        torch.bfloat16 if quant.takes_bf16_prefill(activations) else many.dtype
    )


@pytest.mark.parametrize("prefill_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("activations", quant.ACTIVATIONS)
def test_a_batch_of_decode_rows_takes_a_kept_bf16_copy_where_its_rows_may_round_to_bf16(
    activations, prefill_dtype
) -> None:
    """From BF16_COPY_MIN_ROWS float32 rows on, a kept bfloat16 copy multiplies them (faster
    than the GEMV there), but only where such rows multiply in bfloat16 at all."""
    linear = layer("q4_1", 300, 512)
    quant.set_activations(torch.nn.Sequential(linear), activations)
    quant.set_prefill_dtype(torch.nn.Sequential(linear), prefill_dtype)
    x = torch.randn(quant.BF16_COPY_MIN_ROWS, 512)
    by_blocks = linear(x)
    linear.keep_prefill_copy(torch.bfloat16)
    out = linear(x)
    assert out.dtype == torch.float32
    expected = reference(linear, x)
    linear.blocks.zero_()  # from here on only the copy knows the weight
    if prefill_dtype == torch.bfloat16 and quant.takes_bf16_prefill(activations):
        assert torch.equal(linear(x), out)  # the copy
        assert (out.double() - expected).abs().max() <= 2e-2 * expected.abs().max()
    else:
        assert torch.equal(out, by_blocks)  # the blocks, as without a copy
    fewer = x[: quant.BF16_COPY_MIN_ROWS - 1]
    assert torch.count_nonzero(linear(fewer) - linear.bias) == 0  # fewer rows: the blocks
