"""Paged attention in Triton: the GPU backend that works wherever Triton does.

Two kernels over the same paged cache the CPU backend uses ([blocks, block_size, H_kv, D]
per layer): decode (one query token per sequence; one program per sequence and KV head,
its query heads batched as the rows of one dot product) and prefill (a chunk's queries
over its cached prefix and itself, causally; one program per tile of queries and head).
Both read K and V a token at a time through the block table, with an online softmax in
float32, so neither gathers the context into a new tensor nor builds a mask.

Without a GPU the kernels run in Triton's interpreter (`TRITON_INTERPRET=1`), which is how
CI checks them against the torch backend.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from shared.kvcache.storage import KVStorage
from shared.model import ops
from shared.model.attention import AttentionMetadata, PrefillSpan

# Query rows of one prefill program and keys per inner step. 16 is tl.dot's smallest
# operand edge; larger tiles are a tuning matter for a real GPU, not for correctness.
PREFILL_BLOCK_M = 16
BLOCK_N = 16
# Decode: keys per inner step. A decode step at batch 1 has only as many programs as KV
# heads, each walking its whole context, so contexts are split over more programs until
# the GPU has about PROGRAMS_PER_SM per multiprocessor, and a second kernel merges their
# results (flash-decoding). The split follows the batch and the block table's width, not
# the lengths, so a CUDA graph captured for a shape stays valid for every context in it.
DECODE_BLOCK_N = 64
PROGRAMS_PER_SM = 2


class TritonPagedAttention:
    """AttentionBackend over KVStorage with Triton kernels (CUDA, or the interpreter)."""

    name = "triton"

    def __init__(self, storage: KVStorage, head_dim: int) -> None:
        self.storage = storage
        self.scale = head_dim**-0.5

    def forward(
        self,
        layer_idx: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        k_cache, v_cache = self.storage.layer(layer_idx)
        ops.write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        if meta.num_decode_tokens:
            table, lens = meta.decode_tables()
            decode_attention(out, q, k_cache, v_cache, table, lens, self.scale)
        for span in meta.prefills:
            prefill_attention(out, q, k, v, k_cache, v_cache, span, self.scale)
        return out


def decode_attention(
    out: torch.Tensor,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> None:
    """Rows [0, B) of q [T, H, D] attend over their blocks; results into out's rows."""
    num_seqs = block_table.shape[0]
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    partition, splits = _decode_split(num_seqs * num_kv_heads, block_table, k_cache)
    # Split: each program's softmax-normalised part and its log-sum-exp, merged after.
    # NOTE: unsplit, the kernel never touches them (SPLIT is a constexpr): `out` stands in,
    # so no tensor is allocated per layer and step.
    parts = lse = out
    if splits > 1:
        shape = (num_seqs, num_heads, splits)
        parts = torch.empty((*shape, head_dim), dtype=torch.float32, device=q.device)
        lse = torch.empty(shape, dtype=torch.float32, device=q.device)
    block_d = max(16, triton.next_power_of_2(head_dim))
    _decode_kernel[(num_seqs, num_kv_heads, splits)](
        out,
        parts,
        lse,
        q,
        k_cache,
        v_cache,
        block_table,
        context_lens,
        scale,
        *_row_strides(out, q, k_cache),
        block_table.stride(0),
        k_cache.shape[1],
        head_dim,
        num_heads,
        splits,
        partition,
        GROUP=group,
        BLOCK_G=max(16, triton.next_power_of_2(group)),
        BLOCK_N=DECODE_BLOCK_N,
        BLOCK_D=block_d,
        SPLIT=splits > 1,
        PRECISION=_precision(q),
        DOT_F32=_dot_in_float32(q),
    )
    if splits > 1:
        _merge_kernel[(num_seqs, num_heads)](
            out,
            parts,
            lse,
            out.stride(0),
            out.stride(1),
            num_heads,
            splits,
            head_dim,
            BLOCK_S=triton.next_power_of_2(splits),
            BLOCK_D=block_d,
        )


def _decode_split(programs: int, block_table: torch.Tensor, k_cache: torch.Tensor):
    """(tokens per split, splits): as many splits as fill the GPU, of whole key tiles."""
    max_tokens = block_table.shape[1] * k_cache.shape[1]  # what the table can address
    wanted = triton.cdiv(_multiprocessors(k_cache.device) * PROGRAMS_PER_SM, programs)
    splits = max(1, min(wanted, triton.cdiv(max_tokens, DECODE_BLOCK_N)))
    partition = triton.cdiv(triton.cdiv(max_tokens, splits), DECODE_BLOCK_N) * DECODE_BLOCK_N
    return partition, triton.cdiv(max_tokens, partition)


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    if device.type != "cuda":
        return 1  # Triton's interpreter: programs run one by one anyway
    return torch.cuda.get_device_properties(device).multi_processor_count


def prefill_attention(
    out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    span: PrefillSpan,
    scale: float,
) -> None:
    """One chunk's rows of q attend causally over its context: the cached blocks when it
    has a prefix, else its own k and v (the same values, without the block lookups)."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    paged = span.context_blocks is not None
    keys, values = (k_cache, v_cache) if paged else (k, v)
    num_kv_heads = keys.shape[-2]
    # NOTE: without a prefix the kernel never reads a table (PAGED is a constexpr): any
    # tensor stands in, so none is allocated per span and layer.
    table = span.context_blocks if span.context_blocks is not None else keys
    grid = (triton.cdiv(span.num_tokens, PREFILL_BLOCK_M), num_heads)
    _prefill_kernel[grid](
        out,
        q,
        keys,
        values,
        table,
        scale,
        *_row_strides(out, q, keys),
        span.token_start,
        span.num_tokens,
        span.context_len,
        k_cache.shape[1],
        head_dim,
        GROUP=num_heads // num_kv_heads,
        PAGED=paged,
        BLOCK_M=PREFILL_BLOCK_M,
        BLOCK_N=BLOCK_N,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        PRECISION=_precision(q),
        DOT_F32=_dot_in_float32(q),
    )


def _row_strides(out: torch.Tensor, q: torch.Tensor, keys: torch.Tensor) -> tuple[int, ...]:
    """Token and head strides of out and q, and of keys (paged [blocks, block_size, H_kv,
    D] or flat [T, H_kv, D]: its block stride is 0 when flat). The last dim is dense."""
    for tensor in (out, q, keys):
        if tensor.stride(-1) != 1:
            raise ValueError("attention needs the head dimension contiguous")
    block_stride = keys.stride(0) if keys.dim() == 4 else 0
    return (
        out.stride(0),
        out.stride(1),
        q.stride(0),
        q.stride(1),
        block_stride,
        keys.stride(-3),
        keys.stride(-2),
    )


def _precision(q: torch.Tensor) -> str:
    # NOTE: float32 must stay exact against the torch backend, so no TF32 for it.
    return "ieee" if q.dtype == torch.float32 else "tf32"


def _dot_in_float32(q: torch.Tensor) -> bool:
    # NOTE: Triton's interpreter multiplies bfloat16 operands wrongly (numpy has no bf16),
    # so there the kernels widen them first; on a GPU they stay half-width for the MMA.
    return q.dtype == torch.float32 or os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _attend(q, k, v, visible, m_i, l_i, acc, scale, PRECISION: tl.constexpr, DOT_F32: tl.constexpr):
    """One tile of keys into the running softmax: max m_i, sum l_i, weighted values acc."""
    if DOT_F32:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    scores = tl.dot(q, tl.trans(k), input_precision=PRECISION).to(tl.float32) * scale
    scores = tl.where(visible, scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    p = tl.exp(scores - m_new[:, None])
    alpha = tl.exp(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    pv = tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc * alpha[:, None] + pv.to(tl.float32)


@triton.jit
def _decode_kernel(
    out_ptr,
    parts_ptr,
    lse_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    table_ptr,
    lens_ptr,
    scale,
    stride_ot,
    stride_oh,
    stride_qt,
    stride_qh,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_table,
    block_size,
    head_dim,
    num_heads,
    num_splits,
    partition,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    SPLIT: tl.constexpr,
    PRECISION: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    rows = tl.arange(0, BLOCK_G)
    dims = tl.arange(0, BLOCK_D)
    offsets = tl.arange(0, BLOCK_N)
    heads = kv_head * GROUP + rows
    row_mask = (rows < GROUP)[:, None] & (dims < head_dim)[None, :]
    q = tl.load(
        q_ptr + seq * stride_qt + heads[:, None] * stride_qh + dims[None, :],
        mask=row_mask,
        other=0.0,
    )
    context_len = tl.load(lens_ptr + seq)
    first, last = 0, context_len
    if SPLIT:
        first = split * partition
        last = tl.minimum(context_len, first + partition)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    if DOT_F32:
        q = q.to(tl.float32)
    for start in range(first, last, BLOCK_N):
        positions = start + offsets
        visible = positions < last
        blocks = tl.load(table_ptr + seq * stride_table + positions // block_size, mask=visible)
        token = blocks.to(tl.int64) * stride_kb + (positions % block_size) * stride_kt
        token += kv_head * stride_kh
        kv_mask = visible[:, None] & (dims < head_dim)[None, :]
        k = tl.load(k_ptr + token[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + token[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        m_i, l_i, acc = _attend(q, k, v, visible[None, :], m_i, l_i, acc, scale, PRECISION, DOT_F32)
    # A padding row of a CUDA graph's batch, or a split past the context, saw no key:
    # zeros, not 0 / 0.
    acc = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    if SPLIT:
        part = (seq * num_heads + heads) * num_splits + split
        tl.store(parts_ptr + part[:, None] * head_dim + dims[None, :], acc, mask=row_mask)
        lse = tl.where(l_i > 0, m_i + tl.log(l_i), float("-inf"))
        tl.store(lse_ptr + part, lse, mask=rows < GROUP)
    else:
        tl.store(
            out_ptr + seq * stride_ot + heads[:, None] * stride_oh + dims[None, :],
            acc.to(out_ptr.dtype.element_ty),
            mask=row_mask,
        )


@triton.jit
def _merge_kernel(
    out_ptr,
    parts_ptr,
    lse_ptr,
    stride_ot,
    stride_oh,
    num_heads,
    num_splits,
    head_dim,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """One sequence and head: its splits' parts weighted by their share of the softmax."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    splits = tl.arange(0, BLOCK_S)
    dims = tl.arange(0, BLOCK_D)
    first = (seq * num_heads + head) * num_splits
    lse = tl.load(lse_ptr + first + splits, mask=splits < num_splits, other=float("-inf"))
    top = tl.max(lse, 0)
    weights = tl.exp(lse - tl.where(top == float("-inf"), 0.0, top))
    mask = (splits < num_splits)[:, None] & (dims < head_dim)[None, :]
    parts = tl.load(
        parts_ptr + (first + splits)[:, None] * head_dim + dims[None, :], mask=mask, other=0.0
    )
    total = tl.sum(weights, 0)
    merged = tl.sum(parts * weights[:, None], 0) / tl.where(total > 0, total, 1.0)
    tl.store(
        out_ptr + seq * stride_ot + head * stride_oh + dims,
        merged.to(out_ptr.dtype.element_ty),
        mask=dims < head_dim,
    )


@triton.jit
def _prefill_kernel(
    out_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    table_ptr,
    scale,
    stride_ot,
    stride_oh,
    stride_qt,
    stride_qh,
    stride_kb,
    stride_kt,
    stride_kh,
    token_start,
    num_tokens,
    context_len,
    block_size,
    head_dim,
    GROUP: tl.constexpr,
    PAGED: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    tile = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // GROUP
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    offsets = tl.arange(0, BLOCK_N)
    dim_mask = dims < head_dim
    q_mask = (rows < num_tokens)[:, None] & dim_mask[None, :]
    q = tl.load(
        q_ptr + (token_start + rows)[:, None] * stride_qt + head * stride_qh + dims[None, :],
        mask=q_mask,
        other=0.0,
    )
    # Each query sees the context up to its own position: the prefix, then the chunk.
    query_positions = context_len - num_tokens + rows
    last_key = tl.minimum(context_len, context_len - num_tokens + (tile + 1) * BLOCK_M)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if DOT_F32:
        q = q.to(tl.float32)
    for start in range(0, last_key, BLOCK_N):
        positions = start + offsets
        in_context = positions < last_key
        if PAGED:
            blocks = tl.load(table_ptr + positions // block_size, mask=in_context)
            token = blocks * stride_kb + (positions % block_size) * stride_kt
        else:
            token = (token_start + positions) * stride_kt
        token = token + kv_head * stride_kh
        kv_mask = in_context[:, None] & dim_mask[None, :]
        k = tl.load(k_ptr + token[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + token[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        visible = in_context[None, :] & (positions[None, :] <= query_positions[:, None])
        m_i, l_i, acc = _attend(q, k, v, visible, m_i, l_i, acc, scale, PRECISION, DOT_F32)
    acc = acc / l_i[:, None]
    tl.store(
        out_ptr + (token_start + rows)[:, None] * stride_ot + head * stride_oh + dims[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=q_mask,
    )
