"""Q4_0, Q4_1, Q8_0 and Q4_K rows interleaved 8 at a time (shared/model/kernels/quant_x8.h): the
layout as documented, the 8- and 16-bit GEMVs on it against the dequantized weight on every ISA
build, and the layers (and embeddings) that keep their rows so under integer activations."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shared.model import quant
from shared.model.quant import INTERLEAVED, QuantEmbedding, QuantLinear
from shared.model.quant_formats import FORMATS, random_blocks
from tests.shared.model.test_quant_ops import assert_close, reference, rounded

INTERLEAVABLE = pytest.mark.parametrize("name", quant.INTERLEAVED_FORMATS)
# Each interleaved format under each integer activations' bits.
BY_WAY = pytest.mark.parametrize(
    ("name", "bits"), [(name, bits) for bits in (16, 8) for name in quant.INTERLEAVED_FORMATS]
)
# Row counts: one whole group, groups and a tail, a tail alone; rows of 1, 2 and 8 blocks
# (of 32 values; Q4_K's of 256: `wide`).
SHAPES = [(8, 32), (21, 64), (5, 64), (64, 256)]


def wide(name: str, in_features: int) -> int:
    """`in_features` counted in blocks of 32, as many of the format's blocks."""
    return in_features * FORMATS[name].block_values // 32


def interleaved_by_the_doc(blocks: np.ndarray, name: str) -> np.ndarray:
    """quant_x8.h's layout, written from its comment: per group of 8 rows and block, the 8 d
    (and 8 m), then the values: Q4 in 4 chunks of 32 bytes, byte 4r + t of chunk c holding
    value 8c + t of row r in its low nibble and 8c + 4 + t in its high one; Q8_0 in 16 chunks
    of 16 bytes, byte 2r + h of chunk p holding value 2p + h. The last N % 8 rows as they
    were."""
    if name == "q4_k":
        return q4_k_interleaved_by_the_doc(blocks)
    scalars = 4 if name == "q4_1" else 2
    rows, row_bytes = blocks.shape
    size = FORMATS[name].block_bytes
    out = blocks.copy()
    for g in range(rows // 8):
        group = blocks[8 * g : 8 * g + 8].reshape(8, -1, size)
        for j in range(group.shape[1]):
            plain = group[:, j]
            scalar_bytes = [plain[:, s : s + 2].reshape(-1) for s in range(0, scalars, 2)]
            if name == "q8_0":
                pairs = plain[:, scalars:].reshape(8, 16, 2)  # [row, pair, h]
                values = pairs.transpose(1, 0, 2).reshape(-1)  # chunk p: rows' pairs
            else:
                nibbles = np.concatenate([plain[:, scalars:] & 0x0F, plain[:, scalars:] >> 4], 1)
                values = q4_values_by_the_doc(nibbles)
            at = 8 * g * row_bytes + 8 * size * j
            out.reshape(-1)[at : at + 8 * size] = np.concatenate([*scalar_bytes, values])
    return out


def q4_values_by_the_doc(nibbles: np.ndarray) -> np.ndarray:
    """8 rows' 32 values ([row, value]) as an interleaved Q4 block's 128 bytes of values."""
    out = np.zeros((4, 32), dtype=np.uint8)
    for r in range(8):
        for i in range(32):
            chunk, k = divmod(i, 8)
            out[chunk, 4 * r + k % 4] |= np.uint8(nibbles[r, i] << (4 * (k // 4)))
    return out.ravel()


def q4_k_interleaved_by_the_doc(blocks: np.ndarray) -> np.ndarray:
    """Q4_K per quant_x8.h: per group of 8 rows and super-block, the 8 d, the 8 dmin, byte k
    of the 12 scale bytes of row r at 32 + 8k + r, then each of the 8 sub-blocks' values as
    a Q4 block's (sub-block s: the low nibbles of bytes 16 + 32 (s // 2) ... when s is even,
    the high ones when odd)."""
    rows, row_bytes = blocks.shape
    out = blocks.copy()
    for g in range(rows // 8):
        group = blocks[8 * g : 8 * g + 8].reshape(8, -1, 144)
        for j in range(group.shape[1]):
            plain = group[:, j]
            parts = [plain[:, 0:2].reshape(-1), plain[:, 2:4].reshape(-1)]
            parts.append(plain[:, 4:16].T.reshape(-1))  # [byte k, row r]
            for sub in range(8):
                chunk = plain[:, 16 + 32 * (sub // 2) : 48 + 32 * (sub // 2)]
                parts.append(q4_values_by_the_doc((chunk >> (4 * (sub % 2))) & 0x0F))
            at = 8 * g * row_bytes + 8 * 144 * j
            out.reshape(-1)[at : at + 8 * 144] = np.concatenate(parts)
    return out


@INTERLEAVABLE
@pytest.mark.parametrize(("out_features", "in_features"), SHAPES)
def test_rows_interleave_as_documented_and_back(kernels, name, out_features, in_features):
    fmt, in_features = FORMATS[name], wide(name, in_features)
    blocks = random_blocks(fmt, out_features, in_features, seed=out_features)
    x8 = torch.empty_like(blocks)
    kernels.quant_interleave(x8, blocks, fmt.ggml_type, True)
    assert np.array_equal(x8.numpy(), interleaved_by_the_doc(blocks.numpy(), name))
    back = torch.empty_like(blocks)
    kernels.quant_interleave(back, x8, fmt.ggml_type, False)
    assert torch.equal(back, blocks)


@BY_WAY
@pytest.mark.parametrize(("out_features", "in_features"), SHAPES)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9])
def test_gemv_on_interleaved_rows_is_the_dequantized_weight_times_x_rounded(
    kernels, name, bits, out_features, in_features, rows
):
    fmt, in_features = FORMATS[name], wide(name, in_features)
    blocks = random_blocks(fmt, out_features, in_features, seed=rows)
    x8 = torch.empty_like(blocks)
    kernels.quant_interleave(x8, blocks, fmt.ggml_type, True)
    x, bias = torch.randn(rows, in_features), torch.randn(out_features)
    out = torch.empty(rows, out_features)
    kernels.quant_gemv_int(out, x, x8, fmt.ggml_type | INTERLEAVED, bias, bits, False)
    assert_close(out, reference(rounded(x, bits), blocks, fmt, bias.double()))
    # the portable path puts the rows back and runs GGUF's: bit for bit the plain one
    portable, plain = torch.empty_like(out), torch.empty_like(out)
    kernels.quant_gemv_int(portable, x, x8, fmt.ggml_type | INTERLEAVED, bias, bits, True)
    kernels.quant_gemv_int(plain, x, blocks, fmt.ggml_type, bias, bits, True)
    assert torch.equal(portable, plain)


@BY_WAY
def test_a_row_of_x_sums_alike_alone_and_among_others(kernels, name, bits):
    """Batch invariance: up to 4 rows of x share a pass over the groups, more take more
    passes; each row's sums are its own."""
    fmt, in_features = FORMATS[name], wide(name, 512)
    blocks = random_blocks(fmt, 37, in_features, seed=11)  # 4 groups and a tail of 5
    x8 = torch.empty_like(blocks)
    kernels.quant_interleave(x8, blocks, fmt.ggml_type, True)
    x, bias = torch.randn(9, in_features), torch.randn(37)
    together = torch.empty(9, 37)
    kernels.quant_gemv_int(together, x, x8, fmt.ggml_type | INTERLEAVED, bias, bits, False)
    for m in range(9):
        alone = torch.empty(1, 37)
        row = x[m : m + 1].contiguous()
        kernels.quant_gemv_int(alone, row, x8, fmt.ggml_type | INTERLEAVED, bias, bits, False)
        assert torch.equal(alone[0], together[m]), m


@BY_WAY
def test_gemvs_of_other_sizes_in_between_leave_a_gemv_as_it_was(kernels, name, bits):
    """A thread keeps one buffer of quantized x (and of its bytes) for its GEMVs of up to 16
    rows, grown as needed (more rows take buffers of their own): a GEMV after wider and
    narrower ones, of more and fewer rows, gives what it gave first."""
    fmt = FORMATS[name]
    calls = []
    for rows, in_features in [(2, 64), (9, 512), (17, 64), (1, 32)]:
        in_features = wide(name, in_features)
        blocks = random_blocks(fmt, 16, in_features, seed=in_features)
        x8 = torch.empty_like(blocks)
        kernels.quant_interleave(x8, blocks, fmt.ggml_type, True)
        calls.append((x8, torch.randn(rows, in_features)))
    outs = [torch.empty(x.shape[0], 16) for _, x in calls]
    for (x8, x), out in zip(calls, outs, strict=True):
        kernels.quant_gemv_int(out, x, x8, fmt.ggml_type | INTERLEAVED, None, bits, False)
    x8, x = calls[0]
    again = torch.empty_like(outs[0])
    kernels.quant_gemv_int(again, x, x8, fmt.ggml_type | INTERLEAVED, None, bits, False)
    assert torch.equal(again, outs[0])


@BY_WAY
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_row_of_x_holding_a_nan_gives_nan_outputs_and_leaves_the_others_as_they_were(
    kernels, name, bits, bad
):
    """A float GEMV's row of x holding a NaN (or an infinity) gives NaN outputs, which the
    sampler refuses; the integer GEMV's rounding must not turn it into finite sums. Interleaved
    and plain rows, the portable path, and prefill's rows rounded alike (quant_round_rows)."""
    fmt, in_features = FORMATS[name], wide(name, 512)
    blocks = random_blocks(fmt, 37, in_features, seed=3)
    x8 = torch.empty_like(blocks)
    kernels.quant_interleave(x8, blocks, fmt.ggml_type, True)
    x, bias = torch.randn(3, in_features), torch.randn(37)
    poisoned = x.clone()
    poisoned[1, in_features // 2 + 5] = bad
    ways = [(x8, fmt.ggml_type | INTERLEAVED, False), (blocks, fmt.ggml_type, False)]
    for weight, qtype, portable in [*ways, (blocks, fmt.ggml_type, True)]:
        clean, got = torch.empty(3, 37), torch.empty(3, 37)
        kernels.quant_gemv_int(clean, x, weight, qtype, bias, bits, portable)
        kernels.quant_gemv_int(got, poisoned, weight, qtype, bias, bits, portable)
        assert got[1].isnan().all(), (qtype, portable)
        assert torch.equal(got[0::2], clean[0::2]), (qtype, portable)
    rounded_rows = torch.empty_like(poisoned)
    kernels.quant_round_rows(rounded_rows, poisoned, bits)
    assert rounded_rows[1].isnan().all() and torch.equal(rounded_rows[0::2], rounded(x, bits)[0::2])


@INTERLEAVABLE
@pytest.mark.parametrize(("out_features", "in_features"), [*SHAPES, (70, 512)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_interleaved_rows_dequantize_as_plain_ones(kernels, name, out_features, in_features, dtype):
    fmt, in_features = FORMATS[name], wide(name, in_features)
    blocks = random_blocks(fmt, out_features, in_features, seed=5)
    x8 = torch.empty_like(blocks)
    kernels.quant_interleave(x8, blocks, fmt.ggml_type, True)
    plain = torch.empty(out_features, in_features, dtype=dtype)
    mixed = torch.empty(out_features, in_features, dtype=dtype)
    kernels.quant_dequantize(plain, blocks, fmt.ggml_type)
    kernels.quant_dequantize(mixed, x8, fmt.ggml_type | INTERLEAVED)
    assert torch.equal(plain, mixed)


@INTERLEAVABLE
def test_tiles_read_interleaved_rows_as_plain_ones(kernels, name):
    fmt = FORMATS[name]
    blocks = random_blocks(fmt, 70, 512, seed=5)  # tiles of 16 rows and a tail
    x8 = torch.empty_like(blocks)
    kernels.quant_interleave(x8, blocks, fmt.ggml_type, True)
    x, bias = torch.randn(19, 512), torch.randn(70)
    by_plain, by_x8 = torch.empty(19, 70), torch.empty(19, 70)
    kernels.quant_gemm(by_plain, x, blocks, fmt.ggml_type, bias, 16)
    kernels.quant_gemm(by_x8, x, x8, fmt.ggml_type | INTERLEAVED, bias, 16)
    assert torch.equal(by_plain, by_x8)


def test_interleaved_rows_refuse_what_they_cannot_do(kernels):
    out, x = torch.empty(1, 16), torch.randn(1, 64)
    fmt = FORMATS["q4_1"]
    blocks = random_blocks(fmt, 16, 64, seed=2)
    x8 = torch.empty_like(blocks)
    kernels.quant_interleave(x8, blocks, fmt.ggml_type, True)
    with pytest.raises(RuntimeError, match="not float ones"):
        kernels.quant_gemv(out, x, x8, fmt.ggml_type | INTERLEAVED, None)
    q5 = FORMATS["q5_0"]
    q5_blocks = random_blocks(q5, 16, 64, seed=2)
    with pytest.raises(RuntimeError, match="only Q4_0, Q4_1, Q8_0 and Q4_K"):
        kernels.quant_interleave(torch.empty_like(q5_blocks), q5_blocks, q5.ggml_type, True)
    with pytest.raises(RuntimeError, match="only Q4_0, Q4_1, Q8_0 and Q4_K"):
        kernels.quant_gemv_int(out, x, q5_blocks, q5.ggml_type | INTERLEAVED, None, 16, False)
    qtype = fmt.ggml_type | INTERLEAVED
    with pytest.raises(RuntimeError, match="outside the weight's 16"):
        kernels.quant_lookup(torch.empty(1, 64), x8, torch.tensor([16]), qtype)
    with pytest.raises(RuntimeError, match="another"):
        kernels.quant_interleave(blocks, blocks, fmt.ggml_type, True)  # not in place


def layer(name: str, out_features: int = 44, in_features: int = 128) -> QuantLinear:
    fmt, in_features = FORMATS[name], wide(name, in_features)
    bias = torch.nn.Parameter(torch.randn(out_features), requires_grad=False)
    blocks = random_blocks(fmt, out_features, in_features, seed=7)
    return QuantLinear(blocks, fmt, in_features, bias)


@INTERLEAVABLE
def test_layers_interleave_under_the_integer_activations_their_kernels_take(name):
    linear = layer(name)
    original, k, fmt = linear.blocks.clone(), linear.in_features, linear.fmt
    model = torch.nn.Sequential(linear)
    x = torch.randn(3, k)
    for activations, bits in (("q16", 16), ("q8", 8)):
        quant.set_activations(model, activations)
        assert linear.interleaved and not torch.equal(linear.blocks, original)
        assert torch.equal(linear.gguf_blocks(), original)
        bias = linear.bias.double()
        assert_close(linear(x), reference(rounded(x, bits), original, fmt, bias))
        assert torch.equal(linear.dequantized(), reference(torch.eye(k), original, fmt).float().t())
    quant.set_activations(model, "float")
    assert not linear.interleaved and torch.equal(linear.blocks, original)
    linear(x)  # its GEMV reads GGUF's rows again


@BY_WAY
def test_an_embedding_interleaves_and_looks_its_rows_up_as_before(name, bits):
    fmt, k = FORMATS[name], wide(name, 64)
    blocks = random_blocks(fmt, 21, k, seed=1)  # 2 groups and a tail of 5
    embedding = QuantEmbedding(blocks.clone(), fmt, k, torch.float32)
    ids = torch.tensor([[0, 7, 8, 15, 16, 20], [20, 3, 3, 9, 17, 12]])
    before = embedding(ids)
    quant.set_activations(torch.nn.Sequential(embedding), f"q{bits}")
    assert embedding.interleaved
    assert torch.equal(embedding(ids), before)
    x = torch.randn(2, k)  # the tied head: its GEMV on the interleaved rows
    assert_close(embedding.linear(x), reference(rounded(x, bits), blocks, fmt))


def test_what_cannot_interleave_is_refused():
    q5 = layer("q5_0")  # under q16 it becomes Q8_0 first (test_quant_mixed.py)
    with pytest.raises(ValueError, match="do not interleave"):
        q5.interleave(True)


def test_interleaved_rows_are_read_in_whole_groups():
    linear = layer("q4_1")
    linear.interleave(True)
    with pytest.raises(ValueError, match="split a group"):
        linear.weight_rows(4, 12)
    assert linear.weight_rows(8, 44, torch.float32).shape == (36, 128)  # to the last row
    assert torch.equal(linear.rows(torch.tensor([3, 43])), linear.dequantized()[[3, 43]])


@BY_WAY
@pytest.mark.parametrize("out_features", [8, 16, 37, 88])
def test_two_groups_a_vector_sum_as_one_group_a_vector(kernels, name, bits, out_features):
    """AVX-512 builds multiply two groups of 8 rows at once (quant_dot.cpp: group_x16, from 4
    rows of x), each lane's sums in group_x8's order: bit for bit its output, whatever the
    count of groups (odd ones end on group_x8) and rows of x. AVX2 builds have group_x8 alone:
    the switch is idle there."""
    fmt, in_features = FORMATS[name], wide(name, 128)
    blocks = random_blocks(fmt, out_features, in_features, seed=out_features)
    x8 = torch.empty_like(blocks)
    kernels.quant_interleave(x8, blocks, fmt.ggml_type, True)
    x, bias = torch.randn(6, in_features), torch.randn(out_features)
    for rows in range(1, 7):
        outs = []
        for x16 in (True, False):
            before = kernels.set_gemv_x16(x16)
            try:
                out = torch.empty(rows, out_features)
                kernels.quant_gemv_int(
                    out, x[:rows], x8, fmt.ggml_type | INTERLEAVED, bias, bits, False
                )
                outs.append(out)
            finally:
                kernels.set_gemv_x16(before)
        assert torch.equal(*outs), rows
    assert kernels.set_gemv_x16(True) is True  # on by default, and put back above
