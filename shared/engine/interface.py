"""What services may ask of an engine: the whole of it, so that nothing reaches inside.

Threads: an engine is not thread-safe. Methods marked "engine thread" run where `step`
runs: in a script's own loop, or through `EngineLoop.call` (which runs them between
steps) or in a step's layer hooks. Methods marked "any thread" only read facts fixed at
construction, or counters whose slightly stale value is fine.

`LLMEngine` (shared/engine/engine.py) is the implementation; its public names are
exactly these (tests/shared/engine/test_interface.py holds both to it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from shared.engine.config import EngineConfig
from shared.engine.isolation import LayerHook, StepHook
from shared.engine.output import Completion, RequestOutput
from shared.engine.runner import ModelRunner
from shared.engine.stats import EngineStats
from shared.kvcache.block_pool import KVEvents
from shared.kvcache.storage import KVStorage
from shared.model.config import ModelConfig
from shared.model.tokenizer import Tokenizer
from shared.sampling_params import SamplingParams


@dataclass(frozen=True)
class EngineInfo:
    """Facts about an engine, fixed when it is built."""

    config: EngineConfig
    model: ModelConfig  # the model as workers see it (the mock engine's stand-in shape)
    model_dir: Path  # weights and tokenizer files (the mock engine's tokenizer model)
    namespace: str  # names the KV layout in block hashes; peers must agree on it
    max_model_len: int  # prompt plus generated tokens, at most
    tokenizer: Tokenizer | None  # None when the model directory has none
    weight_bytes: int  # the model's weights in memory (0: the mock engine has none)
    prefill_chunk_cap: int  # prompt tokens per step while several prefill (0: no cap)
    attention: str = "none"  # the attention backend chosen at start-up ("mock": none)
    cuda_graphs: bool = False  # decode steps replay CUDA graphs (shared/engine/cuda_graphs.py)

    @property
    def block_size(self) -> int:
        return self.config.block_size


class EngineInterface(Protocol):
    # -- facts and load ------------------------------------------------------------------

    @property
    def info(self) -> EngineInfo:
        """Model shape, namespace, block size, limits. Any thread."""
        ...

    @property
    def kv_storage(self) -> KVStorage:
        """The KV tensors, for the transfer layer to read and fill by block id. Any
        thread; a block's bytes are safe to touch only while its request holds it."""
        ...

    @property
    def has_unfinished(self) -> bool:
        """Whether a step has work. Any thread (stale by at most a step)."""
        ...

    def stats(self) -> EngineStats:
        """Requests and blocks now, for heartbeats and stats. Any thread, without locks:
        a slightly stale view is fine."""
        ...

    def validate_prompt(self, prompt_token_ids: Sequence[int]) -> None:
        """Raise InvalidRequest when the prompt is empty, out of the vocabulary or too long
        for the context limit. Any thread: reads facts only."""
        ...

    def stop_reason(self, params: SamplingParams, token_id: int) -> tuple[str, int] | None:
        """("stop", token) when `token_id` ends a request with these params (not its
        length). Any thread."""
        ...

    # -- requests ------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        hold_kv: bool = False,
        external_tokens: int = 0,
    ) -> None:
        """Queue a request to compute from its prompt. With `hold_kv` its blocks outlive it
        until `release` (KV to send or write back). `external_tokens`: the prompt's first
        tokens whose KV `reserve_prefix` placed (or is placing) in its blocks; they are not
        computed. Raises InvalidRequest for a bad prompt or a running id. Engine thread."""
        ...

    def abort(self, request_id: str) -> bool:
        """End a running or waiting request (finish_reason "abort"); False when unknown.
        Held KV stays until `release`. Engine thread."""
        ...

    def end_burst(self) -> None:
        """End a burst of decode steps in progress (EngineConfig.decode_burst) after its
        current step, so what `EngineLoop.call` queued waits no longer. Any thread."""
        ...

    def step(
        self,
        layer_hook: LayerHook | None = None,
        layer_gate: LayerHook | None = None,
        on_scheduled: StepHook | None = None,
    ) -> list[RequestOutput]:
        """One forward pass: what each request gained. `layer_hook(layer, chunks)` runs as
        each layer's KV is written (stream it out); `layer_gate(layer, chunks)` before each
        layer computes (wait for loaded KV); `on_scheduled(chunks)` once, before the pass
        computes (no per-layer hook: a decode step keeps the fused path). A request that
        fails alone ends with an error; raises only when the engine itself failed. Engine
        thread."""
        ...

    def fail_all(self, message: str) -> list[RequestOutput]:
        """End every request with an engine error (after a step raised). Engine thread."""
        ...

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        """Run prompts to completion, blocking; for scripts, tests and benchmarks. Engine
        thread (the caller's, with no EngineLoop running)."""
        ...

    def invalidate(self, request_id: str, reason: str) -> None:
        """Its KV cannot be trusted (a load failed): the step ends it with an engine error
        and names none of its blocks. Engine thread (a layer gate)."""
        ...

    # -- KV in and out -------------------------------------------------------------------

    def reserve(self, request_id: str, num_tokens: int, headroom: int = 0) -> list[int] | None:
        """Block ids for `num_tokens` tokens of KV that will arrive from elsewhere, or None
        when that and `headroom` more tokens do not fit (or the id holds blocks). Then
        `install` or `release` it. Engine thread."""
        ...

    def reserve_reusing(
        self, request_id: str, num_tokens: int, headroom: int, block_hashes: Sequence[int]
    ) -> tuple[int, list[int]] | None:
        """`reserve`, with the head of the table taken from the local prefix cache where
        it holds the first of `block_hashes`: their KV need not arrive. (number of such
        blocks, the whole table), or None. Engine thread."""
        ...

    def install(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        first_token: int,
        params: SamplingParams,
        num_cached_tokens: int = 0,
        hold_kv: bool = False,
    ) -> None:
        """Adopt a reserved request whose prompt KV has landed in its blocks and decode it
        from `first_token` on. Engine thread."""
        ...

    def release(self, request_id: str) -> None:
        """Free the blocks of a held, finished or reserved request (no-op when it holds
        none). Engine thread."""
        ...

    def held_blocks(self, request_id: str) -> list[tuple[int, int]]:
        """(block id, block hash) of a finished held request's full, computed blocks: what
        to write back before `release`. Engine thread."""
        ...

    def cached_prefix_blocks(self, block_hashes: Sequence[int], max_blocks: int) -> int:
        """How many of the first `max_blocks` blocks the local prefix cache holds now;
        takes no reference. Engine thread."""
        ...

    def reserve_prefix(
        self, request_id: str, block_hashes: Sequence[int], num_blocks: int
    ) -> tuple[int, list[int]] | None:
        """Blocks for a prompt's first `num_blocks` blocks: the local prefix-cache hit, then
        new ones to fill from elsewhere. Returns (local blocks, ids of the new blocks), or
        None when the pool is short. Then `add_request(..., external_tokens=...)` or
        `release`. Engine thread."""
        ...

    def pin_cached_blocks(self, block_hashes: Sequence[int]) -> list[int] | None:
        """Ids of the cached blocks of these hashes, in order, each referenced so it is
        not evicted while read (`unpin_blocks` after); None, pinning nothing, when any is
        not cached. Engine thread."""
        ...

    def unpin_blocks(self, block_ids: Sequence[int]) -> None:
        """Drop the references `pin_cached_blocks` took (its ids, in its order). Engine
        thread."""
        ...

    def take_kv_events(self) -> KVEvents:
        """Block hashes the prefix cache stored and removed since the last call. Engine
        thread."""
        ...

    def cached_block_hashes(self) -> list[int]:
        """Every block hash the prefix cache holds; pending events are dropped (this
        snapshot supersedes them). Engine thread."""
        ...

    # -- recovery and set-up -------------------------------------------------------------

    def recompute_all(self, num_blocks: int) -> None:
        """Every request's KV is gone (attention workers died): start a new pool of
        `num_blocks` and recompute each running request, losing and repeating no token.
        Engine thread."""
        ...

    def use_runner(self, make: Callable[[ModelRunner], ModelRunner]) -> None:
        """Replace the model runner by `make(current)` (e.g. one whose attention runs on
        attention workers). Torch engines only; before the first step, at set-up."""
        ...
