"""Linear layers over quantized GGUF blocks, computed by the native kernels without a float copy
of the weight (shared/model/kernels/quant_ops.cpp)."""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from shared.model.kernels import cpu_ops
from shared.model.quant_formats import EXACT_IN_Q8_0, FORMATS, QuantFormat, as_q8_0

# NOTE: measured (`python -m bench gemv --formats q4_1,q8_0`, docs/benchmarks.md): the
# in-register GEMV beats float32 tiles up to 8-16 rows, by CPU and build; past 16 tiles and
# the library GEMM win. Tiles of 256 weight rows stay in cache.
GEMV_MAX_ROWS = 8
# NOTE: with 8-bit activations the integer GEMV beats dequantized tiles up to 8-16 rows and
# trails them by 1.4-1.7x at 32 (`python -m bench gemv`, docs/benchmarks.md); taking it up to
# 32 rows keeps a decode row's result the same whatever the batch beside it. That matters for
# q8: rounding x to 8 bits turns the last-bit differences between two kernels into whole 8-bit
# steps, which the next layers carry on (a batch of 10 took the tiles and answered differently
# from a batch of 8, tests/e2e/test_isolation.py). 16-bit activations keep the same limit.
INT_GEMV_MAX_ROWS = 32
GEMM_TILE_ROWS = 256
# NOTE: bfloat16 activations of this many rows or more (prefill chunks) multiply in bfloat16:
# where the CPU has AVX512-BF16 or AMX the library GEMM is 2-3x float32's tiles from 64 rows
# (`python -m bench gemv`, tiles_bf16: docs/benchmarks.md). float32 ones do too where the
# layer's prefill_dtype says so (`--dtype auto` on such a CPU: shared/engine/config.py's
# prefill_matmul_dtype); with `--dtype float32` they never do (float32 stays exact), nor do q8
# activations (prefill must round them as decode does). From this many rows on, a kept prefill
# copy (keep_prefill_copy) multiplies them.
PREFILL_GEMM_MIN_ROWS = 64
# NOTE: a batch of decode rows this large multiplies by a kept bfloat16 copy (where rows may
# multiply in bfloat16 at all: not q8, not `--dtype float32`) rather than the GEMV, whose time
# grows with each row (`python -m bench gemv --rows 8,16,32`; decode batch 16 1.15-1.26x and 32
# 1.29-1.38x this way on a Zen 4: docs/notes/2026-11-26-fused-decode-step.md, "Batched decode by
# the prefill copy"); from 10 rows, as 10-14 rows ran 1.06-1.16x faster by the copy than by the
# GEMV and 9 rows 0.93x (`python -m bench engine --before copy-from-16-rows`, "Batched decode by
# the prefill copy"). Such a batch then rounds as a prefill chunk does (bfloat16), which under
# `--dtype auto` the decode rows sharing a step with a prompt's chunk already did. From 16 since
# rows interleave (INTERLEAVED_FORMATS): the 16-bit GEMV then ran 10-15 rows faster than the
# copy, 16 level; past 16 (the fused step's most GEMV rows, fused_decode.MAX_ROWS) the copy wins
# (`python -m bench engine --before copy-from-10-rows`, `--copy-min-rows 33 --before
# copy-from-16-rows`: docs/notes/2026-11-29-interleaved-rows.md, "Weight rows interleaved 8 at a
# time").
BF16_COPY_MIN_ROWS = 16
# NOTE: bfloat16 rows multiply by the whole weight in one library GEMM, not tile by tile: that
# GEMM (oneDNN; AMX where the CPU has it) packs its operands on every call, which 256-row
# tiles paid a dozen times a layer (`python -m bench gemv`, tiles_bf16: docs/benchmarks.md).
# A weight of more values than this (a large vocabulary's head) goes in parts this big, so
# the bfloat16 copy stays bounded whatever the model.
BF16_WEIGHT_VALUES = 32 << 20  # 64 MiB of bfloat16
# How the GEMV takes its activations: "q8" quantizes each row of x to 8 bits per block of 32
# once per matmul and multiplies in integers (llama.cpp's way: faster, x rounded to 8 bits);
# "q16" the same in 16 bits (x rounded finer than bfloat16 rounds it; as fast as q8 where a
# core, not memory, bounds the float GEMV); "float" widens the weights to float32 and
# multiplies by x as it is.
ACTIVATIONS = ("q8", "q16", "float")
ACTIVATION_BITS = {"q8": 8, "q16": 16}  # the integer ones
# NOTE: under integer activations these formats' rows sit interleaved 8 at a time
# (shared/model/kernels/quant_x8.h): the GEMV on GGUF's own rows was bound by a core converting
# and summing each block's products, not by memory; side by side, a vector's lanes are 8 rows
# and one multiply scales them all (`python -m bench gemv`, `python -m bench engine --before
# plain-rows`: docs/notes/2026-11-29-interleaved-rows.md, "Weight rows interleaved 8 at a
# time"); Q4_K's plain rows ran at a third of memory's speed (`python -m bench gemv --formats
# q4_k --shapes llama-1b`: the same note, "Q4_K rows interleaved"), and under 8-bit
# activations the Q4 formats' GEMV ran twice as fast on interleaved rows as on plain ones
# (the same note, "Byte dot products").
INTERLEAVED_FORMATS = ("q4_0", "q4_1", "q8_0", "q4_k")
# NOTE: a format whose values Q8_0 holds exactly but that does not interleave (Q5_0: d * (q -
# 16), q < 32) becomes Q8_0 under 16-bit activations, and interleaves: the GEMV on plain Q5_0
# rows is core-bound like Q4's was (interleaved Q8_0 1.28x, 1.75x, 1.91x at 1, 4 and 8 rows, for
# 8.5 bits a weight instead of 5.5: `python -m bench gemv --formats q5_0,q8_0`,
# docs/notes/2026-11-25-weight-formats.md, "A Q4_K_M file").
INTERLEAVED = 1 << 8  # or-ed into the kernels' type code (quant_blocks.h: kInterleaved)
GROUP_ROWS = 8  # rows interleaved together (quant_x8.h: kRows)


class QuantLinear(nn.Module):
    """y = x @ W^T (+ b) with W kept as blocks [out_features, row_bytes] of one format.

    Activations are computed in float32 and returned in the input's dtype; up to
    GEMV_MAX_ROWS rows multiply as `activations` says (ACTIVATIONS).
    """

    blocks: torch.Tensor
    activations = "float"
    gemv_max_rows = GEMV_MAX_ROWS
    prefill_dtype = torch.float32  # what many float32 rows multiply in (set_prefill_dtype)
    prefill_copy: PrefillWeight | None = None  # what many rows multiply by, if kept
    copy_min_rows = BF16_COPY_MIN_ROWS  # decode rows from which the copy takes them
    interleaved = False  # rows 8 at a time side by side (INTERLEAVED_FORMATS, q16 or q8)

    def __init__(
        self, blocks: torch.Tensor, fmt: QuantFormat, in_features: int, bias: nn.Parameter | None
    ) -> None:
        super().__init__()
        if blocks.dtype != torch.uint8 or blocks.shape[1] != fmt.row_bytes(in_features):
            raise ValueError(f"{tuple(blocks.shape)} are not {fmt.name} rows of {in_features}")
        self.register_buffer("blocks", blocks.contiguous())
        self.fmt, self.in_features, self.out_features = fmt, in_features, blocks.shape[0]
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)

    def linear(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and x.dim() == 2 and self.gemv_takes(x.shape[0]):
            return self.gemv(x.contiguous())  # NOTE: a decode step's path: no copies, no views
        if self.matmul_dtype(x) == torch.bfloat16:
            return self.linear_bf16(x)
        rows = x.reshape(-1, self.in_features).float().contiguous()
        out = self.gemv(rows) if rows.shape[0] <= self.gemv_max_rows else self.gemm(rows)
        return out.view(*x.shape[:-1], self.out_features).to(x.dtype)

    def gemv_takes(self, num_rows: int) -> bool:
        """Whether `num_rows` float32 rows [M, in_features] take the GEMV as they are (a decode
        step's; the fused step's head asks too): few enough, and no kept copy takes them."""
        return num_rows <= self.gemv_max_rows and not (
            num_rows >= self.copy_min_rows and self.copy_in(torch.bfloat16) is not None
        )

    def gemv(self, rows: torch.Tensor) -> torch.Tensor:
        """rows float32 [M, in_features], M small: the in-register GEMV."""
        out = rows.new_empty(rows.shape[0], self.out_features)
        bias = None if self.bias is None else self.bias.float()
        bits = ACTIVATION_BITS.get(self.activations)
        if bits is not None:
            native = _kernels()
            native.quant_gemv_int(out, rows, self.blocks, self.kernel_type, bias, bits, False)
        else:
            _kernels().quant_gemv(out, rows, self.blocks, self.kernel_type, bias)
        return out

    @property
    def kernel_type(self) -> int:
        """The blocks' type code for the native kernels: the GGML type, and whether
        interleaved."""
        return self.fmt.ggml_type | (INTERLEAVED if self.interleaved else 0)

    def can_interleave(self) -> bool:
        """Whether the rows may sit interleaved: a format that can."""
        return self.fmt.name in INTERLEAVED_FORMATS

    def interleaves(self) -> bool:
        """Whether the rows sit interleaved under this layer's activations: integer ones, in
        a format that can."""
        return self.activations in ACTIVATION_BITS and self.can_interleave()

    def interleave(self, on: bool) -> None:
        """Puts the rows 8 at a time side by side (or back in GGUF's order), in place: the
        same bytes where they were (a weight arena keeps its placement)."""
        if on == self.interleaved:
            return
        if on and not self.can_interleave():
            raise ValueError(f"{self.fmt.name} rows of {type(self).__name__} do not interleave")
        out = self._converted(on)
        with torch.inference_mode():  # NOTE: blocks may be an inference tensor
            self.blocks.copy_(out)
        self.interleaved = on

    def widens(self) -> bool:
        """Whether the rows become Q8_0 to interleave: a format Q8_0 holds exactly that does
        not interleave itself."""
        return self.fmt.name in EXACT_IN_Q8_0 and not self.can_interleave()

    def widen(self) -> None:
        """The blocks rewritten as Q8_0, which holds the same values (a format EXACT_IN_Q8_0
        names): a new buffer, so before the weights move into an arena."""
        if self.interleaved:
            raise ValueError("widen rows in GGUF's order, not interleaved ones")
        self.blocks = as_q8_0(self.blocks, self.fmt)
        self.fmt = FORMATS["q8_0"]

    def _converted(self, interleaved: bool) -> torch.Tensor:
        """A copy of the blocks with the rows interleaved, or put back in GGUF's order."""
        out = torch.empty_like(self.blocks)
        _kernels().quant_interleave(out, self.blocks, self.fmt.ggml_type, interleaved)
        return out

    def gemm(self, rows: torch.Tensor) -> torch.Tensor:
        """rows float32 [M, in_features], M large: dequantized tiles and the library GEMM."""
        if self.activations in ACTIVATION_BITS:
            # NOTE: rounded as the integer GEMV rounds them, so that prefill computes what
            # decode computes (a request prefilled again continues as one that decoded).
            rows = round_activations(rows, ACTIVATION_BITS[self.activations])
        bias = None if self.bias is None else self.bias.float()
        copy = self.copy_in(torch.float32)
        if copy is not None and self.many_rows(rows):
            return copy.linear(rows, bias)
        out = rows.new_empty(rows.shape[0], self.out_features)
        _kernels().quant_gemm(out, rows, self.blocks, self.kernel_type, bias, GEMM_TILE_ROWS)
        return out

    def copy_in(self, dtype: torch.dtype) -> PrefillWeight | None:
        """The kept prefill copy if it is in `dtype`."""
        copy = self.prefill_copy
        return copy if copy is not None and copy.dtype == dtype else None

    def matmul_dtype(self, x: torch.Tensor) -> torch.dtype:
        """What rows like x multiply in here: bfloat16 for a prefill chunk (or a batch a kept
        bfloat16 copy takes) that linear_bf16 multiplies (the caller may hand them over in it
        and keep its result so: no conversions), float32 for rows the GEMV takes, else x's
        own dtype."""
        many = self.many_rows(x) or self.copy_takes(x)
        if many and takes_bf16_prefill(self.activations) and self.bf16_rows(x):
            return torch.bfloat16
        if self.gemv_rows(x):
            return torch.float32
        return x.dtype

    def gemv_rows(self, x: torch.Tensor) -> bool:
        """Whether x's rows are few enough for the GEMV, which computes in float32 whatever
        x's dtype: a bfloat16 decode row through the library's bfloat16 GEMM instead took 8x
        its time (`python -m bench engine --dtype bfloat16`, docs/benchmarks.md)."""
        return x.numel() <= self.gemv_max_rows * self.in_features

    def many_rows(self, x: torch.Tensor) -> bool:
        return x.numel() >= PREFILL_GEMM_MIN_ROWS * self.in_features

    def copy_takes(self, x: torch.Tensor) -> bool:
        """Whether a kept bfloat16 copy is there for x's rows, copy_min_rows or more
        (where bfloat16 rows may multiply by it: matmul_dtype says)."""
        enough = x.numel() >= self.copy_min_rows * self.in_features
        return enough and self.copy_in(torch.bfloat16) is not None

    def bf16_rows(self, x: torch.Tensor) -> bool:
        return x.dtype == torch.bfloat16 or (
            x.dtype == torch.float32 and self.prefill_dtype == torch.bfloat16
        )

    def linear_bf16(self, x: torch.Tensor) -> torch.Tensor:
        """y = x @ W^T (+ b) for many rows, in x's dtype: the weight dequantized straight to
        bfloat16 and multiplied by the library's bfloat16 GEMM (x rounded to bfloat16 too)."""
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16).contiguous()
        bias = None if self.bias is None else self.bias.to(torch.bfloat16)
        copy = self.copy_in(torch.bfloat16)
        if copy is not None:
            out = copy.linear(rows, bias).to(x.dtype)
            return out.view(*x.shape[:-1], self.out_features)
        # NOTE: whole groups of interleaved rows a part
        part = max(
            GEMM_TILE_ROWS, BF16_WEIGHT_VALUES // self.in_features // GROUP_ROWS * GROUP_ROWS
        )
        if part >= self.out_features:  # one part: the GEMM's own output, no copy in bfloat16
            out = F.linear(rows, self.weight_rows(0, self.out_features), bias).to(x.dtype)
            return out.view(*x.shape[:-1], self.out_features)
        out = x.new_empty(rows.shape[0], self.out_features)
        for n0 in range(0, self.out_features, part):
            n1 = min(n0 + part, self.out_features)
            weight = self.weight_rows(n0, n1)
            # NOTE: into a fresh tensor, then copied: the library's bfloat16 GEMM writing
            # into a strided slice of `out` falls back to a path 7x slower (measured).
            part_bias = None if bias is None else bias[n0:n1]
            out[:, n0:n1] = F.linear(rows, weight, part_bias)
        return out.view(*x.shape[:-1], self.out_features)

    def weight_rows(self, n0: int, n1: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """Weight rows n0:n1 dequantized to `dtype` (bfloat16 or float32), a fresh tensor.
        Interleaved, n0 and n1 are multiples of 8 (or n1 the last row): whole groups."""
        if self.interleaved and (n0 % GROUP_ROWS or (n1 % GROUP_ROWS and n1 != self.out_features)):
            raise ValueError(f"rows {n0}:{n1} split a group of 8 interleaved rows")
        weight = torch.empty(n1 - n0, self.in_features, dtype=dtype)
        _kernels().quant_dequantize(weight, self.blocks[n0:n1], self.kernel_type)
        return weight

    def keep_prefill_copy(self, dtype: torch.dtype, packed: bool = True) -> int:
        """Keep the weight dequantized to `dtype` (what prompts multiply in: bfloat16 or
        float32) for many-row matmuls, so that no pass dequantizes it again: 2 or 4 bytes a
        weight more. Decode's GEMV still reads the quantized blocks. Returns the bytes it
        takes."""
        self.prefill_copy = PrefillWeight(self.weight_rows(0, self.out_features, dtype), packed)
        return self.prefill_copy.nbytes

    def gguf_blocks(self) -> torch.Tensor:
        """The blocks in GGUF's own row order: `blocks` itself, or a copy of it with the
        interleaved rows put back."""
        return self._converted(False) if self.interleaved else self.blocks

    def dequantized(self) -> torch.Tensor:
        """The whole weight as float32 [out_features, in_features]."""
        return self.weight_rows(0, self.out_features, torch.float32)

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        """Rows `index` of the weight, dequantized to float32."""
        out = torch.empty(index.numel(), self.in_features)
        if self.interleaved:  # each read out of its group of 8
            _kernels().quant_lookup(out, self.blocks, index.long().contiguous(), self.kernel_type)
            return out
        _kernels().quant_dequantize(out, self.blocks.index_select(0, index), self.fmt.ggml_type)
        return out

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, format={self.fmt.name}"


class PrefillWeight:
    """A bfloat16 or float32 weight [out_features, in_features] kept for the library GEMM:
    packed once in oneDNN's own layout where torch's build can (the plain GEMM packs it again
    on every call, which short prompts feel most: `python -m bench engine --before
    quantized-prefill`, docs/benchmarks.md; float32 rows multiply faster by it than by the
    tiles' library GEMM on an AVX2-only EPYC too), else plain."""

    def __init__(self, weight: torch.Tensor, packed: bool = True) -> None:
        self.dtype = weight.dtype
        self.packed = packed and can_pack(weight.dtype)
        self.weight = (
            torch.ops.mkldnn._reorder_linear_weight(weight, PACKED_FOR_ROWS)
            if self.packed
            else weight
        )

    def linear(self, rows: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """rows [M, in_features] -> [M, out_features], both in the copy's dtype."""
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(rows, self.weight, bias, "none", [], "")
        return F.linear(rows, self.weight, bias)

    @property
    def nbytes(self) -> int:
        return self.weight.nbytes


# The rows oneDNN tunes a packed weight's layout for; any other count multiplies by it too.
PACKED_FOR_ROWS = 128


def can_pack(dtype: torch.dtype) -> bool:
    """Whether torch's oneDNN can pack `dtype` weights here (inductor's own freezing path)."""
    mkldnn = torch.ops.mkldnn
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(mkldnn, "_reorder_linear_weight")
        and hasattr(mkldnn, "_linear_pointwise")
        and (dtype == torch.float32 or bool(mkldnn._is_mkldnn_bf16_supported()))
    )


class QuantEmbedding(QuantLinear):
    """A token embedding over quantized rows: each token's row is dequantized when looked up;
    `linear` is the tied output head."""

    def __init__(self, blocks: torch.Tensor, fmt: QuantFormat, in_features: int, dtype) -> None:
        super().__init__(blocks, fmt, in_features, None)
        self.dtype = dtype

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.rows(input_ids.flatten()).view(*input_ids.shape, -1).to(self.dtype)


def takes_bf16_prefill(activations: str) -> bool:
    """Whether prefill chunks under these activations may multiply in bfloat16 (where the
    layer's prefill dtype says so): float and q16 ones, whose own rounding is finer than
    bfloat16's; not q8 ones, which prefill must round as decode does (a request prefilled
    again continues as one that decoded: whole 8-bit steps apart otherwise)."""
    return activations != "q8"


def round_activations(rows: torch.Tensor, bits: int) -> torch.Tensor:
    """rows [M, K] float32 as the integer GEMV of `bits` (8 or 16) sees them: per block of 32,
    d = max|x| / (2^(bits-1) - 1), x = d * round(x / d) (quant_dot.cpp's own rounding)."""
    out = torch.empty_like(rows)
    _kernels().quant_round_rows(out, rows.contiguous(), bits)
    return out


def set_activations(model: nn.Module, activations: str, max_rows: int | None = None) -> None:
    """How every quantized layer of `model` takes its activations (ACTIVATIONS), and up to how
    many rows the GEMV computes (default: as measured for those activations; more: scoring a
    text as decode would, one row at a time)."""
    if activations not in ACTIVATIONS:
        raise ValueError(f"activations {activations!r}: choose one of {', '.join(ACTIVATIONS)}")
    if max_rows is None:
        max_rows = INT_GEMV_MAX_ROWS if activations in ACTIVATION_BITS else GEMV_MAX_ROWS
    for module in model.modules():
        if isinstance(module, QuantLinear):
            module.activations, module.gemv_max_rows = activations, max_rows
    interleave_rows(model, activations in ACTIVATION_BITS)


def interleave_rows(model: nn.Module, on: bool) -> None:
    """Every quantized layer of `model` whose activations take interleaved rows
    (QuantLinear.interleaves) with its rows interleaved 8 at a time, the others (all, when
    not `on`) in GGUF's order; under 16-bit activations interleaving first turns the layers
    QuantLinear.widens names into Q8_0 (they stay Q8_0). A fused decode stack built before
    reads the old layout: build it after."""
    for module in model.modules():
        if not isinstance(module, QuantLinear):
            continue
        if on and module.activations == "q16" and module.widens():
            module.widen()
        if module.can_interleave():
            module.interleave(on and module.interleaves())


def set_prefill_dtype(model: nn.Module, dtype: torch.dtype) -> None:
    """What every quantized layer of `model` multiplies many float32 rows in: float32, or
    bfloat16 where the CPU computes it natively (EngineConfig.prefill_matmul_dtype)."""
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"prefill dtype {dtype}: float32 or bfloat16")
    for module in model.modules():
        if isinstance(module, QuantLinear):
            module.prefill_dtype = dtype


def set_copy_min_rows(model: nn.Module, rows: int) -> None:
    """The decode rows from which every quantized layer of `model` multiplies them by its kept
    bfloat16 copy (BF16_COPY_MIN_ROWS unless a benchmark's "before" says otherwise)."""
    for module in model.modules():
        if isinstance(module, QuantLinear):
            module.copy_min_rows = rows


def keep_prefill_copies(model: nn.Module, dtype: torch.dtype, packed: bool = True) -> int:
    """A `dtype` copy of every quantized linear layer's weight but the output head (its rows
    are the last tokens': few, the GEMV's), `packed` for the library where it can; returns the
    bytes they take."""
    return sum(module.keep_prefill_copy(dtype, packed) for module in _prefill_layers(model))


def prefill_copy_bytes(model: nn.Module, dtype: torch.dtype) -> int:
    """What keep_prefill_copies would take, before taking it."""
    size = dtype.itemsize
    return sum(size * m.out_features * m.in_features for m in _prefill_layers(model))


def _prefill_layers(model: nn.Module) -> Iterator[QuantLinear]:
    for name, module in model.named_modules():
        if type(module) is QuantLinear and name.rsplit(".", 1)[-1] != "lm_head":
            yield module


def _kernels():
    native = cpu_ops()
    if native is None:
        raise RuntimeError("quantized weights need the native CPU kernels (weights='float32')")
    return native


def has_kernels() -> bool:
    """Whether quantized layers can run here (x86 with AVX2 and a compiler)."""
    return cpu_ops() is not None
