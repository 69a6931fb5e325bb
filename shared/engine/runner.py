"""Turns a step's sequence chunks into one forward pass over the paged cache."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from shared.engine.config import EngineConfig, cpu_has_amx, keeps_prefill_copy, max_model_len
from shared.engine.cuda_graphs import DecodeGraphs
from shared.engine.logits_process import History, adjusted
from shared.engine.metadata import attention_metadata
from shared.engine.sampler import logprobs, sample
from shared.kvcache.storage import KVStorage
from shared.logprob import TokenLogprob
from shared.model.attention import AttentionBackend, AttentionMetadata, TorchPagedAttention
from shared.model.attention_choice import attention_backend, backend_name
from shared.model.config import ModelConfig
from shared.model.fused_decode import fused_decode
from shared.model.kernels import cpu_ops
from shared.model.llama import ForwardBatch, LlamaModel
from shared.model.quant import (
    keep_prefill_copies,
    prefill_copy_bytes,
    set_activations,
    set_prefill_dtype,
    takes_bf16_prefill,
)
from shared.model.quant_loader import load_model_as
from shared.model.registry import gguf_source
from shared.model.weight_arena import pack_weights
from shared.sampling_params import SamplingParams

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SeqChunk:
    """One sequence's share of a step: tokens to compute and where their KV lives."""

    request_id: str
    token_ids: Sequence[int]  # the tokens computed in this step
    start_pos: int  # tokens of the sequence already in the KV cache
    block_ids: Sequence[int]  # block table covering start_pos + len(token_ids)
    num_logits: int = 1  # logits wanted for this many trailing tokens

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def context_len(self) -> int:
        return self.start_pos + len(self.token_ids)


class ModelRunner:
    """Owns the model and the KV tensors; knows nothing of requests or scheduling.

    With `fused` (and where it applies: CPU, float32 or quantized bfloat16, the torch paged
    backend), a step of decode tokens alone runs in one native call, from the embeddings to
    the final norm or the logits (shared/model/fused_decode.py).
    """

    def __init__(
        self,
        model: LlamaModel,
        storage: KVStorage,
        backend: AttentionBackend,
        fused: bool = True,
        graphs: DecodeGraphs | None = None,
    ) -> None:
        self.model = model
        self.storage = storage
        self.backend = backend
        self.block_size = storage.block_size
        self.device = storage.kv.device
        self.fused = fused_decode(model, backend) if fused else None
        self.graphs = graphs

    @property
    def attention_name(self) -> str:
        return backend_name(self.backend)

    @property
    def weight_bytes(self) -> int:
        tensors = [*self.model.parameters(), *self.model.buffers()]  # quantized blocks: buffers
        return sum(t.numel() * t.element_size() for t in tensors)

    @torch.inference_mode()
    def execute(
        self,
        chunks: Sequence[SeqChunk],
        backend: AttentionBackend | None = None,
        on_layer_done: Callable[[int], None] | None = None,
        before_layer: Callable[[int], None] | None = None,
    ) -> list[torch.Tensor]:
        """Run the chunks; return float32 logits [num_logits, vocab] per chunk, in order
        (a CUDA graph's are valid until the next step)."""
        hooked = on_layer_done is not None or before_layer is not None
        own_backend = backend is None or backend is self.backend
        if self.graphs is not None and not hooked and own_backend and self.graphs.fits(chunks):
            return self.graphs.run(chunks)
        order, ordered = decode_first(chunks)
        input_ids, positions, meta = self.prepare(ordered)
        by_copy = self._fused_route(meta, backend) if not hooked else None
        if self.fused is not None and by_copy is not None:
            with_head = self.fused.head_takes(len(ordered), by_copy) and all_logits(ordered)
            out = self.fused.forward(input_ids, meta, by_copy, with_head)
            if with_head:  # the step's logits, a row a chunk
                return in_order(order, [out] if len(ordered) == 1 else list(out.split(1)))
            hidden = out
        else:
            attend = backend or self.backend
            batch = ForwardBatch(
                positions=positions,
                on_layer_done=on_layer_done,
                before_layer=before_layer,
                attention=lambda layer, q, k, v: attend.forward(layer, q, k, v, meta),
            )
            hidden = self.model(input_ids, batch)
        return in_order(order, self._logits(hidden, ordered))

    def burst_takes(self, num_rows: int) -> bool:
        """Whether `burst` runs `num_rows` decode rows: the fused step computes their logits
        on this runner's own KV (FusedDecode.burst_takes)."""
        return self.fused is not None and self.fused.burst_takes(num_rows)

    @torch.inference_mode()
    def burst(
        self, chunks: Sequence[SeqChunk], steps: int, stop: torch.Tensor | None = None
    ) -> list[list[int]]:
        """`steps` greedy steps of decode chunks (a token each, block tables holding `steps`
        more) in one native call -> each chunk's tokens in order: the argmax of each step's
        logits, as `execute` and greedy sampling would give them one step at a time;
        SAMPLING_FAILED (-1) from a row's first unusable logits on; fewer where `stop` ended
        it early (FusedDecode.burst)."""
        assert self.fused is not None, "burst_takes says where a burst runs"
        input_ids, _, meta = self.prepare(chunks)
        table, lens = meta.decode_tables()
        return self.fused.burst(input_ids, table, lens, steps, stop).t().tolist()

    def _fused_route(
        self, meta: AttentionMetadata, backend: AttentionBackend | None
    ) -> bool | None:
        """The fused decode's route (FusedDecode.route) for a step of decode tokens alone on
        this runner's own backend; None where the module path runs the step."""
        if self.fused is None or meta.prefills:
            return None
        if backend is not None and backend is not self.backend:  # offloaded attention
            return None
        return self.fused.route(meta.num_decode_tokens)

    def sample(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        generators: Sequence[torch.Generator | None],
        histories: Sequence[History | None],
        stop_ids: Collection[int],
    ) -> tuple[list[int], list[TokenLogprob | None]]:
        """logits [B, vocab] -> a token id per row, and its logprob where one is asked for
        (of the model's own logits: penalties and biases change the choice, not those)."""
        token_ids = sample(adjusted(logits, params, histories, stop_ids), params, generators)
        return token_ids, logprobs(logits, token_ids, [p.logprobs for p in params])

    def prepare(
        self, chunks: Sequence[SeqChunk]
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """Flat token ids, positions and attention metadata; decode chunks must come first."""
        positions, meta = attention_metadata(chunks, self.block_size, self.device)
        token_ids = [t for chunk in chunks for t in chunk.token_ids]
        return torch.tensor(token_ids, dtype=torch.long, device=self.device), positions, meta

    def _logits(self, hidden: torch.Tensor, chunks: Sequence[SeqChunk]) -> list[torch.Tensor]:
        rows: list[int] = []
        counts: list[int] = []
        end = 0
        for chunk in chunks:
            end += len(chunk.token_ids)
            rows.extend(range(end - chunk.num_logits, end))
            counts.append(chunk.num_logits)
        if not rows:
            return [hidden.new_empty((0, 0))] * len(chunks)
        if len(rows) < hidden.shape[0]:  # else every row (a decode step's): no gather
            hidden = hidden[torch.tensor(rows, dtype=torch.long, device=hidden.device)]
        logits = self.model.compute_logits(hidden)
        return [logits] if len(chunks) == 1 else list(logits.split(counts))


def torch_runner(config: EngineConfig, model_dir: Path) -> tuple[ModelRunner, ModelConfig, int]:
    """The runner of the model in `model_dir`, its config, and the pool's blocks (from
    `num_blocks`, or as many as `kv_cache_bytes` holds)."""
    device = config.device
    if device == "cpu":
        cpu_ops()  # build (once per machine) before serving, not in a first request
    dtype = getattr(torch, config.resolved_dtype)
    gguf = gguf_source(config.model) if config.weights != "float" else None
    model = load_model_as(config.weights, model_dir, gguf, dtype, device)
    set_activations(model, config.activations)
    if config.prefill_matmul_dtype in ("float32", "bfloat16"):
        set_prefill_dtype(model, getattr(torch, config.prefill_matmul_dtype))
    keep_prefill_copy(config, model)
    if device == "cpu" and config.huge_pages:
        log.info("weights in one arena: %.0f MB", pack_weights(model) / 1e6)
    mc = model.config
    num_blocks = config.num_blocks or max(
        1,
        config.kv_cache_bytes
        // KVStorage.bytes_per_block(
            mc.num_layers,
            config.block_size,
            mc.num_kv_heads,
            mc.head_dim,
            dtype,
        ),
    )
    storage = KVStorage(
        mc.num_layers,
        num_blocks if config.local_kv else 0,
        config.block_size,
        mc.num_kv_heads,
        mc.head_dim,
        dtype,
        device,
        huge_pages=config.huge_pages,
    )
    backend = attention_backend(config.attention, storage, mc.head_dim)
    if isinstance(backend, TorchPagedAttention) and prefill_bf16(config):
        backend.prefill_dtype = torch.bfloat16  # prompts attend in what they multiply in
        # NOTE: with AMX, torch's bfloat16 kernel multiplies on the tiles (a third of float32's
        # time from 512 tokens on a Sapphire Rapids); the native kernel's float32 FMAs are
        # unmeasured there, so those CPUs keep torch's.
        backend.native_prefill = not cpu_has_amx()
    log.info("attention backend %s on %s", backend_name(backend), device)
    graphs = decode_graphs(config, model, storage, backend, num_blocks)
    runner = ModelRunner(model, storage, backend, config.fused_decode, graphs)
    if device == "cpu":  # NOTE: a step layer by layer decodes far slower: say so at start
        log.info("decode steps: %s", decode_path(runner, config))
    return runner, mc, num_blocks


def decode_path(runner: ModelRunner, config: EngineConfig) -> str:
    if runner.fused is not None:
        head = "the logits" if runner.fused.head is not None else "the final norm"
        return f"fused (from the tokens' embeddings to {head} in one native call)"
    if not config.fused_decode:
        return "layer by layer (fused decode turned off)"
    return "layer by layer (no fused step for this model, dtype or attention backend)"


def keep_prefill_copy(config: EngineConfig, model: LlamaModel) -> None:
    """Quantized weights' copy for prefill, in what prompts multiply in, where
    config.prefill_weights says so."""
    dtype = torch.bfloat16 if prefill_bf16(config) else torch.float32
    copy_bytes = prefill_copy_bytes(model, dtype)
    if not copy_bytes:
        return
    name = str(dtype).removeprefix("torch.")
    if not keeps_prefill_copy(config.prefill_weights, name, copy_bytes):
        if config.prefill_weights not in ("auto", "quantized"):
            log.warning(
                "--prefill-weights %s: prompts multiply in %s here, so no copy is kept",
                config.prefill_weights,
                name,
            )
        return
    log.info("keeping a %s copy of the weights for prefill: %.0f MB", name, copy_bytes / 1e6)
    keep_prefill_copies(model, dtype)


def prefill_bf16(config: EngineConfig) -> bool:
    """Whether prompts multiply, and so attend, in bfloat16 (over float32 activations, quant.py's
    linear_bf16: float or q16 activations, which bfloat16 rounds coarser than their own
    rounding; q8 ones round prefill as decode does, and stay float32)."""
    return config.prefill_matmul_dtype == "bfloat16" and takes_bf16_prefill(config.activations)


def decode_graphs(
    config: EngineConfig,
    model: LlamaModel,
    storage: KVStorage,
    backend: AttentionBackend,
    num_blocks: int,
) -> DecodeGraphs | None:
    """CUDA graphs for decode steps where they apply: a GPU, the engine's own KV, and the
    Triton backend (its KV write skips the padding rows' slots)."""
    if not (config.cuda_graphs and storage.kv.is_cuda and config.local_kv):
        return None
    if backend_name(backend) != "triton":
        return None
    max_len = max_model_len(config, model.config.max_position_embeddings, num_blocks)
    max_blocks = -(-max_len // config.block_size)
    log.info("decode steps replay CUDA graphs (batch buckets up to %d)", config.max_num_seqs)
    return DecodeGraphs(
        model, backend, storage.kv.device, config.block_size, config.max_num_seqs, max_blocks
    )


def all_logits(chunks: Sequence[SeqChunk]) -> bool:
    """Whether each chunk wants its one token's logits (a decode step's usually do)."""
    return all(chunk.num_logits == 1 for chunk in chunks)


def decode_first(chunks: Sequence[SeqChunk]) -> tuple[list[int], list[SeqChunk]]:
    """The chunks with single-token ones first (the layout attention metadata needs), and
    where each came from."""
    order = sorted(range(len(chunks)), key=lambda i: chunks[i].num_tokens > 1)
    return order, [chunks[i] for i in order]


def in_order(order: list[int], rows: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Per-chunk results of `decode_first`'s layout, back in the callers' chunk order."""
    by_position = dict(zip(order, rows))
    return [by_position[i] for i in range(len(order))]
