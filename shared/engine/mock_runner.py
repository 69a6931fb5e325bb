"""A runner without a model: each step takes the cost model's time and answers tokens made
from a hash, over a real (scaled-down) KV storage that the data plane reads and fills.

It stands where `ModelRunner` does, with the same `execute` and `sample`, so the engine's
scheduler, block pool and prefix cache, and the services' layer hooks, run unchanged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Protocol

import torch
import xxhash

from shared.engine.config import EngineConfig
from shared.engine.logits_process import History
from shared.engine.mock import MockSpec
from shared.engine.runner import SeqChunk
from shared.kvcache.storage import KVStorage
from shared.logprob import TokenLogprob
from shared.model.config import ModelConfig
from shared.sampling_params import SamplingParams

log = logging.getLogger("kvstack.engine")

# Layer hooks run at their layer's share of the step, but a wait shorter than this is
# skipped (the next layer catches up): a worker wakes at most once a millisecond.
MIN_LAYER_SLEEP = 1e-3


class StepCost(Protocol):
    """What pacing a step needs of a cost model (shared/costmodel's models have it)."""

    def prefill_time(self, num_new: int, num_cached: int = 0) -> float: ...

    def decode_step_time(self, batch_size: int, total_context: int) -> float: ...


def step_seconds(cost: StepCost, chunks: Sequence[SeqChunk]) -> float:
    """The cost model's time for one step: each prefill chunk after its cached tokens, and
    the single-token chunks as one decode step. One forward pass pays its fixed cost (the
    launch overhead and reading the weights: a prefill of nothing) once, however many parts
    share it."""
    decodes = [c for c in chunks if c.num_tokens == 1]
    parts = [cost.prefill_time(c.num_tokens, c.start_pos) for c in chunks if c.num_tokens > 1]
    if decodes:
        parts.append(cost.decode_step_time(len(decodes), sum(c.context_len for c in decodes)))
    if not parts:
        return 0.0
    fixed = cost.prefill_time(0, 0)
    return max(max(parts), sum(parts) - (len(parts) - 1) * fixed)


class MockRunner:
    """Owns the KV storage; knows nothing of requests or scheduling (as ModelRunner)."""

    def __init__(
        self, storage: KVStorage, cost: StepCost, vocab_size: int, avoid: Iterable[int] = ()
    ) -> None:
        self.storage = storage
        self.cost = cost
        self.block_size = storage.block_size
        self.num_layers = storage.kv.shape[0]
        self.vocab_size = vocab_size
        self.avoid = frozenset(avoid)  # never answered: stop and special tokens
        self.device = storage.kv.device
        self.graphs = None  # no CUDA graphs: nothing is computed

    @property
    def weight_bytes(self) -> int:
        return 0  # no weights in memory

    @property
    def attention_name(self) -> str:
        return "mock"  # no attention computed

    def execute(
        self,
        chunks: Sequence[SeqChunk],
        backend: object = None,
        on_layer_done: Callable[[int], None] | None = None,
        before_layer: Callable[[int], None] | None = None,
    ) -> list[torch.Tensor]:
        """Take the step's modelled time, calling the layer hooks as a model would; return
        the chosen token ids [num_logits] per chunk, in order. Time the hooks take (KV
        streaming out, waits for loaded KV) is part of that time, not added to it."""
        started = time.perf_counter()
        duration = step_seconds(self.cost, chunks)
        if on_layer_done is not None or before_layer is not None:
            self._pace_layers(started, duration, on_layer_done, before_layer)
        _sleep_until(started + duration)
        return [self._tokens(chunk) for chunk in chunks]

    def _pace_layers(
        self,
        started: float,
        duration: float,
        on_layer_done: Callable[[int], None] | None,
        before_layer: Callable[[int], None] | None,
    ) -> None:
        for layer in range(self.num_layers):
            if before_layer is not None:
                before_layer(layer)
            _sleep_until(started + duration * (layer + 1) / self.num_layers, MIN_LAYER_SLEEP)
            if on_layer_done is not None:
                on_layer_done(layer)

    def sample(
        self,
        rows: torch.Tensor,
        params: Sequence[SamplingParams],
        generators: Sequence[torch.Generator | None],
        histories: Sequence[History | None],
        stop_ids: Collection[int],
    ) -> tuple[list[int], list[TokenLogprob | None]]:
        """The rows are the tokens already chosen; the mock model is sure of each one
        (penalties and biases do not move it)."""
        token_ids = rows.tolist()
        return token_ids, [
            None if p.logprobs is None else TokenLogprob(t, 0.0, ((t, 0.0),) if p.logprobs else ())
            for t, p in zip(token_ids, params)
        ]

    def next_token(self, token_id: int, position: int) -> int:
        """The token after `token_id` when `position` tokens precede the new one: a hash of
        the two, so a prompt gets the same answer on every worker and every retry."""
        token = xxhash.xxh3_64_intdigest(f"{token_id}:{position}".encode()) % self.vocab_size
        while token in self.avoid:
            token = (token + 1) % self.vocab_size
        return token

    def _tokens(self, chunk: SeqChunk) -> torch.Tensor:
        first = chunk.num_tokens - chunk.num_logits
        ids = [
            self.next_token(chunk.token_ids[i], chunk.start_pos + i + 1)
            for i in range(first, chunk.num_tokens)
        ]
        return torch.tensor(ids, dtype=torch.long)


def mock_runner(
    config: EngineConfig,
    spec: MockSpec,
    tokenizer_model: ModelConfig,
    special_ids: Iterable[int] = (),
) -> tuple[MockRunner, ModelConfig, int]:
    """The runner of `spec` (the config's `mock`), the model config workers see, and the
    pool's blocks.

    KV is one-byte elements (`token_half_bytes` of them per token, layer, K or V); the
    vocabulary is the tokenizer model's, and its stop and special tokens are never answered.
    """
    model_config = spec.model_config(tokenizer_model, config.max_model_len)
    num_blocks = config.num_blocks or spec.num_blocks(config.block_size, config.kv_cache_bytes)
    storage = KVStorage(
        model_config.num_layers,
        num_blocks if config.local_kv else 0,
        config.block_size,
        1,
        spec.token_half_bytes,
        torch.uint8,
    )
    avoid = {*model_config.eos_token_ids, *special_ids}
    log.info(
        "mock engine: %s on %s; KV %d B per token (%d real), %d blocks of %d tokens "
        "(the hardware holds %s)",
        spec.model,
        spec.hardware,
        spec.kv_bytes_per_token,
        spec.shape.kv_bytes_per_token,
        num_blocks,
        config.block_size,
        spec.real_capacity_blocks(config.block_size) or "an unknown number",
    )
    return (
        MockRunner(storage, spec.cost(), model_config.vocab_size, avoid),
        model_config,
        num_blocks,
    )


def _sleep_until(deadline: float, min_sleep: float = 0.0) -> None:
    remaining = deadline - time.perf_counter()
    if remaining > min_sleep:
        time.sleep(remaining)
