"""A pure decode step in one native call (kernels/decode_stack.cpp): the tokens' embeddings,
every layer, the final norm and, where the head is a quantized GEMV, the logits.

The native stack runs the kernels the module path runs (ops, QuantLinear's GEMV or its kept
bfloat16 copy, the torch paged attention backend), in its order, so its hidden states and
logits are bit-identical to `LlamaModel.forward`'s and `compute_logits`'; it saves the Python
and torch dispatch between them.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any, cast

import torch

from shared.model import ops
from shared.model.attention import AttentionBackend, AttentionMetadata, TorchPagedAttention
from shared.model.kernels import cpu_ops
from shared.model.layers import GatedMLP, Linear, RMSNorm
from shared.model.llama import Attention, DecoderLayer, LlamaModel
from shared.model.quant import ACTIVATION_BITS, QuantEmbedding, QuantLinear, takes_bf16_prefill

# The most decode rows the native stack takes on the GEMV (decode_stack.cpp's kMaxRows), and
# by the kept bfloat16 copies (kMaxCopyRows).
MAX_ROWS = 16
MAX_COPY_ROWS = 1024
# What the stack's activations and KV may be in (one dtype for both); a bfloat16 stack's
# linears must all be quantized: their GEMV computes in float32 (decode_stack.cpp).
STACK_DTYPES = (torch.float32, torch.bfloat16)
# NOTE: a C loop over the ~120 linears, not a generator: the route phase of a batch-1 step went
# from 57-61 us to 48-54 (`python -m bench step-phases`:
# docs/notes/2026-11-30-batch-1-decode-step.md, "A leaner decode step")
COPY_MIN_ROWS = attrgetter("copy_min_rows")


class FusedDecode:
    """Decode-only steps of one model over one KV pool in one native call each.

    NOTE: the quantized layers' activations ("float", "q8" or "q16") and row limits are read
    when the stack is built: set them first (shared/model/quant.py: set_activations).
    """

    def __init__(
        self,
        model: LlamaModel,
        stack: Any,
        has_float: bool,
        quant_rows: int,
        copied: list[QuantLinear] | None = None,
        head: QuantLinear | None = None,
    ) -> None:
        self.model = model
        self.stack = stack
        self.head = head  # the logits head the stack computes, if it does
        self.has_float = has_float  # some linear is float32: ops.linear's routing applies
        self.quant_rows = quant_rows  # the quantized linears' GEMV limit (and MAX_ROWS)
        self.copied = copied or []  # quantized linears with a bfloat16 copy kept
        # the copies the stack multiplies by (a step by copy needs every linear's, unchanged)
        self.kept = [m.prefill_copy for m in self.copied]
        self.all_copied = stack is not None and stack.takes_copies()

    def fits(self, num_rows: int) -> bool:
        """Whether the stack computes a step of `num_rows` rows as the module path would."""
        return self.route(num_rows) is not None

    def route(self, num_rows: int) -> bool | None:
        """How the stack computes a step of `num_rows` rows as the module path would: on the
        GEMV (False) or by the kept bfloat16 copies (True); None where it cannot (the module
        path runs that step). Decided once a step: forward takes it."""
        if self.on_gemv(num_rows):
            return False
        if self.by_copy(num_rows):
            return True
        return None

    def by_copy(self, num_rows: int) -> bool:
        """Whether the module path multiplies `num_rows` float32 rows by every linear's kept
        bfloat16 copy (QuantLinear.linear_bf16: from its copy_min_rows on, where its
        activations and prefill dtype let rows multiply in bfloat16)."""
        if not self.all_copied or num_rows > MAX_COPY_ROWS:
            return False
        return all(
            m.prefill_copy is kept  # NOTE: read on every step, as copy_min_rows
            and num_rows >= m.copy_min_rows
            and m.prefill_dtype == torch.bfloat16
            and takes_bf16_prefill(m.activations)
            for m, kept in zip(self.copied, self.kept, strict=True)
        )

    def on_gemv(self, num_rows: int) -> bool:
        """Whether every linear of the module path takes its GEMV for `num_rows` rows (a
        library GEMM, or a kept bfloat16 copy from its copy_min_rows on, would round
        differently)."""
        limit = self.quant_rows
        if self.has_float:
            limit = min(limit, ops.gemv_max_rows(torch.float32))
        if self.copied:  # NOTE: read on every step: a benchmark's "before" may change it
            limit = min(limit, min(map(COPY_MIN_ROWS, self.copied)) - 1)
        return 1 <= num_rows <= limit

    def head_takes(self, num_rows: int, by_copy: bool) -> bool:
        """Whether the stack computes the logits of a step of `num_rows` rows as
        `compute_logits` would: its head on the GEMV (a step by copy leaves them to it)."""
        return self.head is not None and not by_copy and self.head.gemv_takes(num_rows)

    def forward(
        self, input_ids: torch.Tensor, meta: AttentionMetadata, by_copy: bool, logits: bool
    ) -> torch.Tensor:
        """input_ids [B] of B decode tokens -> final hidden states [B, hidden], as
        `LlamaModel.forward` returns them, by the route `route(B)` gave; with `logits` (where
        `head_takes` says) float32 logits [B, vocab], as `compute_logits` returns them."""
        cos, sin = self.model.rotary.tables(meta.decode_max_context)
        table, lens = meta.decode_tables()
        return self.stack.step(input_ids, cos, sin, meta.slot_mapping, table, lens, by_copy, logits)

    def burst_takes(self, num_rows: int) -> bool:
        """Whether `burst` takes `num_rows` rows: the stack computes their logits (on the
        GEMV), as `compute_logits` would."""
        return self.route(num_rows) is False and self.head_takes(num_rows, False)

    def burst(
        self,
        input_ids: torch.Tensor,
        table: torch.Tensor,
        lens: torch.Tensor,
        steps: int,
        stop: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`steps` greedy decode steps in one native call (DecodeStack.burst): input_ids [B]
        at context lengths `lens` [B] (the token's own included), `table` [B, blocks] holding
        lens + steps - 1 tokens a row -> [steps, B] int64 tokens, each the argmax of the
        logits `forward` would return for that step, -1 from a row's first unusable logits
        (non-finite) on. A nonzero `stop` ([1] uint8) ends it after the step in progress:
        fewer rows then."""
        cos, sin = self.model.rotary.tables(int(lens.max()) + steps - 1)
        return self.stack.burst(input_ids, cos, sin, table, lens, steps, stop)


def fused_decode(
    model: LlamaModel, backend: AttentionBackend, isa: str | None = None
) -> FusedDecode | None:
    """`model`'s fused decode over `backend`'s KV pool (with the `isa` build of the kernels,
    default the chosen one), or None where it does not apply: another backend than the CPU
    torch one, no native kernels, a KV dtype other than float32 or bfloat16, or a layer it
    cannot take (in bfloat16: every linear quantized).

    NOTE: the quantized linears' bfloat16 copies are the stack's as they are now: keep them
    first (shared/model/quant.py: keep_prefill_copies)."""
    native = cpu_ops(isa)
    if native is None or not isinstance(backend, TorchPagedAttention):
        return None
    kv = backend.storage.kv
    if kv.device.type != "cpu" or kv.dtype not in STACK_DTYPES or not kv.numel():
        return None
    if not all(_fusable(layer, kv.dtype) for layer in model.layers):
        return None
    embedding = _native_embedding(model.embed_tokens, kv.dtype)
    if embedding is None or not _is_cpu(model.norm.weight, kv.dtype):
        return None
    layers = cast(list[DecoderLayer], list(model.layers))
    config = model.config
    head = _stack_head(model, kv.dtype)
    stack = native.DecodeStack(
        [_native_layer(native, layer) for layer in layers],
        heads=config.num_heads,
        kv_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        eps=config.rms_norm_eps,
        scale=backend.scale,
        kv=kv,
        embedding=embedding[0],
        embedding_qtype=embedding[1],
        final_norm=model.norm.weight,
        head=None if head is None else _native_linear(native, head, with_copy=False),
    )
    linears = [linear for layer in layers for linear in _linears(layer)]
    quant = [m for m in linears if isinstance(m, QuantLinear)]
    copied = [m for m in quant if m.copy_in(torch.bfloat16) is not None]
    has_float = len(quant) < len(linears)
    quant_rows = min([MAX_ROWS, *(m.gemv_max_rows for m in quant)])
    return FusedDecode(model, stack, has_float, quant_rows, copied, head)


def _native_embedding(
    embedding: torch.nn.Module, dtype: torch.dtype
) -> tuple[torch.Tensor, int | None] | None:
    """The stack's embedding (weight, qtype: None for a float weight), or None where it cannot
    look the rows up as the module does."""
    if isinstance(embedding, QuantEmbedding):  # rows dequantized, then in the model's dtype
        return (embedding.blocks, embedding.kernel_type) if embedding.dtype == dtype else None
    if type(embedding) is torch.nn.Embedding and _is_cpu(embedding.weight, dtype):
        return embedding.weight, None
    return None


def _stack_head(model: LlamaModel, dtype: torch.dtype) -> QuantLinear | None:
    """The logits head where the stack can compute it: a quantized one (compute_logits's
    QuantLinear.linear) over a float32 stack's hidden states; else compute_logits runs."""
    head = model.embed_tokens if model.lm_head is None else model.lm_head
    if dtype != torch.float32 or not isinstance(head, QuantLinear):
        return None
    return head if head.bias is None or head.bias.device.type == "cpu" else None


def _linears(layer: DecoderLayer) -> tuple[torch.nn.Module, ...]:
    attn, mlp = layer.self_attn, layer.mlp
    return attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj


def _fusable(layer: torch.nn.Module, dtype: torch.dtype) -> bool:
    """A Llama-family layer in `dtype` whose every linear a native GEMV computes."""
    if type(layer) is not DecoderLayer or type(layer.self_attn) is not Attention:
        return False
    if type(layer.mlp) is not GatedMLP:
        return False
    norms = (layer.input_layernorm, layer.post_attention_layernorm)
    if not all(type(n) is RMSNorm and _is_cpu(n.weight, dtype) for n in norms):
        return False
    return all(_fusable_linear(linear, dtype) for linear in _linears(layer))


def _fusable_linear(linear: torch.nn.Module, dtype: torch.dtype) -> bool:
    if type(linear) is QuantLinear:  # its bias is added in float32 (_native_linear)
        return linear.bias is None or linear.bias.device.type == "cpu"
    if type(linear) is Linear and dtype == torch.float32:
        return _is_cpu(linear.weight, dtype) and (
            linear.bias is None or _is_cpu(linear.bias, dtype)
        )
    return False


def _is_cpu(t: torch.Tensor, dtype: torch.dtype) -> bool:
    return t.dtype == dtype and t.device.type == "cpu" and t.is_contiguous()


def _native_layer(native: Any, layer: DecoderLayer) -> Any:
    qkv, o, gate_up, down = (_native_linear(native, m) for m in _linears(layer))
    return native.StackLayer(
        layer.input_layernorm.weight, layer.post_attention_layernorm.weight, qkv, o, gate_up, down
    )


def _native_linear(native: Any, linear: torch.nn.Module, with_copy: bool = True) -> Any:
    """The stack's linear: its weight, and its kept bfloat16 copy where `with_copy` says."""
    if isinstance(linear, QuantLinear):
        bits = ACTIVATION_BITS.get(linear.activations, 0)
        bias = None if linear.bias is None else linear.bias.float().contiguous()
        copy = linear.copy_in(torch.bfloat16) if with_copy else None
        if copy is None:
            return native.StackLinear(linear.blocks, linear.kernel_type, bits, bias)
        copy_bias = None if linear.bias is None else linear.bias.to(torch.bfloat16)
        return native.StackLinear(
            linear.blocks, linear.kernel_type, bits, bias, copy.weight, copy_bias, copy.packed
        )
    assert isinstance(linear, Linear)
    return native.StackLinear(linear.weight, None, 0, linear.bias)
