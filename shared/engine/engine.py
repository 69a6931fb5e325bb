"""The engine of one model process: requests in, tokens out, one step at a time.

`step()` is the whole loop: the scheduler picks what runs, the runner computes,
and the results (sampled tokens, text, stops) are folded back. Services call it
from a worker thread so their event loops stay free.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from shared.engine.burst import burst_fits, bursts
from shared.engine.config import EngineConfig, max_model_len
from shared.engine.device import with_concrete_device
from shared.engine.grammar import Grammars
from shared.engine.interface import EngineInfo, EngineInterface, EngineStats
from shared.engine.isolation import LayerHook, StepHook, execute_isolated
from shared.engine.logits_process import History
from shared.engine.mock_runner import MockRunner, mock_runner
from shared.engine.namespace import kv_namespace
from shared.engine.output import (
    ENGINE_ERROR,
    REQUEST_ERROR,
    UNSATISFIABLE_ERROR,
    Completion,
    RequestOutput,
)
from shared.engine.runner import ModelRunner, SeqChunk, torch_runner
from shared.engine.sampler import SAMPLING_FAILED, sampling_failure, seeded_generator
from shared.engine.scheduler import ScheduledSeq, Scheduler, SchedulerConfig, is_prefilling
from shared.engine.sequence import Sequence
from shared.engine.stats import tokens_to_compute
from shared.engine.step_threads import StepThreads
from shared.engine.step_time import smoothed
from shared.engine.stop import StopStringMatcher
from shared.errors import InvalidRequest, KvstackError
from shared.kvcache.block_pool import KVEvents
from shared.kvcache.manager import KVCacheManager
from shared.kvcache.storage import KVStorage
from shared.logprob import TokenLogprob
from shared.model.config import ModelConfig
from shared.model.detokenizer import IncrementalDetokenizer
from shared.model.registry import resolve_model
from shared.model.tokenizer import Tokenizer, has_tokenizer
from shared.sampling_params import SamplingParams
from shared.structured.matcher import GrammarMatcher, GrammarViolation

log = logging.getLogger("kvstack.engine")

# How a request ends: ("stop", its stop token or string) or ("length", None).
_Stop = tuple[str, int | str | None]


@dataclass
class _Extras:
    """Per-request state beside the Sequence: text, stops and grammar."""

    detokenizer: IncrementalDetokenizer | None
    stops: StopStringMatcher
    grammar: GrammarMatcher | None = None


class LLMEngine:
    """The engine behind `EngineInterface` (shared/engine/interface.py, where each public
    method's contract is written): everything else here is private."""

    def __init__(self, config: EngineConfig | None = None) -> None:
        self._config = config = with_concrete_device(config or EngineConfig())
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        self._threads = StepThreads(config.num_threads, config.prefill_threads)
        self._model_dir = resolve_model(config.model)  # the mock engine uses its tokenizer
        self._tokenizer = (
            Tokenizer.from_dir(self._model_dir) if has_tokenizer(self._model_dir) else None
        )
        self._runner: ModelRunner | MockRunner
        if config.mock is None:
            self._runner, self._model_config, num_blocks = torch_runner(config, self._model_dir)
            self._namespace = kv_namespace(
                self._model_dir, config.resolved_dtype, config.kv_weights
            )
        else:
            special = self._tokenizer.all_special_ids if self._tokenizer is not None else ()
            self._runner, self._model_config, num_blocks = mock_runner(
                config, config.mock, ModelConfig.from_dir(self._model_dir), special
            )
            self._namespace = config.mock.namespace
        mc = self._model_config
        self._kv = KVCacheManager(num_blocks, config.block_size, config.enable_prefix_cache)
        self._scheduler = Scheduler(
            SchedulerConfig(
                config.max_num_batched_tokens,
                config.max_num_seqs,
                config.enable_chunked_prefill,
                config.long_prefill_tokens,
            ),
            self._kv,
        )
        self._max_model_len = max_model_len(config, mc.max_position_embeddings, num_blocks)
        self._eos_token_ids = set(mc.eos_token_ids)
        if self._tokenizer is not None and self._tokenizer.eos_token_id is not None:
            self._eos_token_ids.add(self._tokenizer.eos_token_id)
        self._grammars = Grammars(self._tokenizer, self._eos_token_ids, config.mock is not None)
        self._extras: dict[str, _Extras] = {}
        self._hold_kv: set[str] = set()
        self._held: dict[str, Sequence] = {}  # finished, blocks kept until `release`
        self._generator = torch.Generator(device=config.device).manual_seed(config.seed)
        self._ids = itertools.count()
        self._bursts_up_to = config.decode_burst  # 1 after a burst failed
        self._decode_seconds = 0.0  # a decode-only step's, lately (bursts: a step of one)
        self._burst_stop = torch.zeros(1, dtype=torch.uint8)  # end_burst sets it
        self._info = EngineInfo(
            config,
            mc,
            self._model_dir,
            self._namespace,
            self._max_model_len,
            self._tokenizer,
            self._runner.weight_bytes,
            self._scheduler.prefill_chunk_cap,
            self._runner.attention_name,
            self._runner.graphs is not None,
        )

    @property
    def info(self) -> EngineInfo:
        return self._info

    @property
    def kv_storage(self) -> KVStorage:
        return self._runner.storage

    @property
    def has_unfinished(self) -> bool:
        return self._scheduler.has_unfinished

    def stats(self) -> EngineStats:
        waiting, running = list(self._scheduler.waiting), list(self._scheduler.running)
        return EngineStats(
            num_running=len(running),
            num_waiting=len(waiting),
            queued_tokens=sum(map(self._waiting_tokens, waiting))
            + sum(s.num_tokens - s.num_computed_tokens for s in running if is_prefilling(s)),
            context_tokens=sum(s.num_tokens for s in running),
            free_blocks=self._kv.num_free_blocks,
            total_blocks=self._kv.pool.num_blocks,
        )

    def _waiting_tokens(self, seq: Sequence) -> int:
        """Tokens a waiting prompt will compute: not its prefix, loaded or cached here."""
        # NOTE: prefix() only looks blocks up (no reference taken), safe beside the engine
        # thread
        _, prefix = self._scheduler.prefix(seq)
        return tokens_to_compute(seq.num_tokens, max(prefix, seq.num_computed_tokens))

    def use_runner(self, make: Callable[[ModelRunner], ModelRunner]) -> None:
        if not isinstance(self._runner, ModelRunner):
            raise KvstackError("the mock engine has no model runner to replace")
        self._runner = make(self._runner)

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Seq[int],
        params: SamplingParams,
        hold_kv: bool = False,
        external_tokens: int = 0,
    ) -> None:
        """Queue a request. With hold_kv its blocks outlive it until `release` (KV to send).

        `external_tokens`: the prompt's first tokens whose KV is (or is being) placed in the
        blocks `reserve_prefix` gave it; they are not computed.
        """
        self.validate_prompt(prompt_token_ids)
        if request_id in self._extras:
            raise InvalidRequest(f"request id {request_id!r} is already running")
        seq = Sequence(
            request_id, prompt_token_ids, params, self._config.block_size, self._namespace
        )
        seq.num_external_tokens = min(external_tokens, seq.num_tokens - 1)
        self._extras[request_id] = self._make_extras(seq)
        if hold_kv:
            self._hold_kv.add(request_id)
        self._scheduler.add(seq)

    def reserve(self, request_id: str, num_tokens: int, headroom: int = 0) -> list[int] | None:
        """Blocks for `num_tokens` tokens of KV that will arrive from elsewhere, or None.

        Only granted when `headroom` more tokens would still fit, so admitted requests
        can grow without preempting each other at once.
        """
        reserved = self.reserve_reusing(request_id, num_tokens, headroom, ())
        return None if reserved is None else reserved[1]

    def reserve_reusing(
        self, request_id: str, num_tokens: int, headroom: int, block_hashes: Seq[int]
    ) -> tuple[int, list[int]] | None:
        """`reserve`, with the head of the table taken from the local prefix cache where it
        holds the first of `block_hashes` (a decode worker that decoded an earlier turn of
        the conversation): their KV need not arrive. Returns (number of those blocks, the
        whole table)."""
        if request_id in self._kv.block_tables:
            return None
        cached = self._kv.match_prefix(list(block_hashes))
        if not self._kv.can_allocate(request_id, num_tokens + headroom, cached):
            return None
        self._kv.allocate_slots(request_id, num_tokens, cached)
        return len(cached), self._kv.block_ids(request_id)

    def reserve_prefix(
        self, request_id: str, block_hashes: Seq[int], num_blocks: int
    ) -> tuple[int, list[int]] | None:
        """Blocks for a prompt's first `num_blocks` blocks: the ones the local prefix cache
        holds (a hit), then new ones to fill from elsewhere. Returns (number of local
        blocks, ids of the new blocks), or None when the pool is short."""
        cached = self._kv.match_prefix(list(block_hashes), num_blocks)
        if not self._kv.allocate_slots(request_id, num_blocks * self._config.block_size, cached):
            return None
        return len(cached), self._kv.block_ids(request_id)[len(cached) :]

    def cached_prefix_blocks(self, block_hashes: Seq[int], max_blocks: int) -> int:
        return len(self._kv.match_prefix(list(block_hashes), max_blocks))

    def pin_cached_blocks(self, block_hashes: Seq[int]) -> list[int] | None:
        pool = self._kv.pool
        blocks = [pool.lookup(h) for h in block_hashes]
        found = [b for b in blocks if b is not None]
        if len(found) < len(blocks):
            return None
        pool.touch(found)
        return [b.block_id for b in found]

    def unpin_blocks(self, block_ids: Seq[int]) -> None:
        pool = self._kv.pool
        # NOTE: in reverse, so the tail blocks are evicted first.
        pool.free([pool.blocks[i] for i in reversed(block_ids)])

    def take_kv_events(self) -> KVEvents:
        return self._kv.pool.take_events()

    def cached_block_hashes(self) -> list[int]:
        return self._kv.pool.snapshot()

    def invalidate(self, request_id: str, reason: str) -> None:
        """Its KV cannot be trusted (a load failed mid-step): the step ends it with an
        error (worth retrying elsewhere), samples nothing and names none of its blocks.
        Engine thread only."""
        seq = self._scheduler.find(request_id)
        if seq is not None:
            seq.invalidate(reason, ENGINE_ERROR)

    def install(
        self,
        request_id: str,
        prompt_token_ids: Seq[int],
        first_token: int,
        params: SamplingParams,
        num_cached_tokens: int = 0,
        hold_kv: bool = False,
    ) -> None:
        """Adopt a reserved request whose prompt KV has arrived, and decode it from here."""
        seq = Sequence(
            request_id, prompt_token_ids, params, self._config.block_size, self._namespace
        )
        seq.num_computed_tokens = seq.num_prompt_tokens
        seq.num_cached_tokens = num_cached_tokens
        seq.append(first_token)
        self._kv.allocate_slots(request_id, seq.num_tokens)
        self._kv.name_full_blocks(request_id, seq.block_hashes, seq.num_computed_tokens)
        extras = self._make_extras(seq)
        if extras.detokenizer is not None:
            extras.stops.feed(extras.detokenizer.step(first_token))
        self._extras[request_id] = extras
        if hold_kv:
            self._hold_kv.add(request_id)
        self._scheduler.adopt(seq)

    def release(self, request_id: str) -> None:
        """Free the blocks of a held or reserved request."""
        self._hold_kv.discard(request_id)
        self._held.pop(request_id, None)
        self._kv.free(request_id)

    def held_blocks(self, request_id: str) -> list[tuple[int, int]]:
        """(block id, block hash) of a finished held request's full, computed blocks."""
        seq = self._held.get(request_id)
        if seq is None:
            return []
        num_full = min(seq.num_computed_tokens // self._config.block_size, len(seq.block_hashes))
        return list(zip(self._kv.block_ids(request_id)[:num_full], seq.block_hashes[:num_full]))

    def recompute_all(self, num_blocks: int) -> None:
        """Every request's KV is gone (its attention workers died): start a new pool of
        `num_blocks` and recompute each running request over prompt + generated tokens.
        Its next token is sampled from there, so no token is repeated or lost."""
        self._scheduler.preempt_all()
        for request_id in [*self._held, *self._kv.block_tables]:
            self.release(request_id)
        self._kv = KVCacheManager(
            num_blocks, self._config.block_size, self._config.enable_prefix_cache
        )
        self._scheduler.kv = self._kv

    def fail_all(self, message: str) -> list[RequestOutput]:
        """End every request with finish_reason "error" (after a failed step): the engine's
        failure, not theirs."""
        seqs = [*self._scheduler.running, *self._scheduler.waiting]
        outputs = []
        for seq in seqs:
            seq.error_kind = ENGINE_ERROR
            self._scheduler.finish(seq, "error", message)
            self._extras.pop(seq.request_id, None)
            self._hold_kv.discard(seq.request_id)
            outputs.append(self._output(seq, (), "", None))
        return outputs

    def validate_prompt(self, prompt_token_ids: Seq[int]) -> None:
        vocab_size = self._model_config.vocab_size
        if not prompt_token_ids:
            raise InvalidRequest("the prompt is empty")
        bad = next((t for t in prompt_token_ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise InvalidRequest(f"token id {bad} is outside the vocabulary [0, {vocab_size})")
        if len(prompt_token_ids) >= self._max_model_len:
            raise InvalidRequest(
                f"the prompt has {len(prompt_token_ids)} tokens; the context limit is "
                f"{self._max_model_len} (prompt plus at least one generated token)"
            )

    def abort(self, request_id: str) -> bool:
        seq = self._scheduler.find(request_id)
        if seq is None:
            return False
        # NOTE: held KV may still be on its way out; `release` frees it when the send is done.
        self._scheduler.finish(seq, "abort", free_kv=request_id not in self._hold_kv)
        self._extras.pop(request_id, None)
        return True

    def step(
        self,
        layer_hook: LayerHook | None = None,
        layer_gate: LayerHook | None = None,
        on_scheduled: StepHook | None = None,
    ) -> list[RequestOutput]:
        """One forward pass. `layer_hook(layer, chunks)` runs as each layer's KV is written;
        `layer_gate(layer, chunks)` before each layer computes (wait for loaded KV there);
        `on_scheduled(chunks)` once before the pass (a per-layer hook costs decode steps
        their fused path).

        A request whose chunk fails alone, or whose next token cannot be sampled, ends
        with an error; the others go on. Raises only when the engine itself failed."""
        try:
            return self._step(layer_hook, layer_gate, on_scheduled)
        finally:
            # NOTE: cleared as a step ends, not as a burst starts: a call queued after the
            # loop ran its calls, before the next step, still ends that step's burst; one
            # queued before the clearing runs before the next step anyway
            self._burst_stop.zero_()

    def _step(
        self,
        layer_hook: LayerHook | None,
        layer_gate: LayerHook | None,
        on_scheduled: StepHook | None,
    ) -> list[RequestOutput]:
        out = self._scheduler.schedule()
        if not out.scheduled:
            return []
        hooked = layer_hook is not None or layer_gate is not None
        steps = 1 if hooked else self._burst_steps(out.scheduled)
        if steps > 1 and not self._reserve_burst(out.scheduled, steps):
            steps = 1
        chunks = [self._chunk(s) for s in out.scheduled]
        if log.isEnabledFor(logging.DEBUG):  # with the loop's step time: where a load goes
            prompt = [c.num_tokens for c in chunks if c.num_tokens > 1]
            log.debug(
                "step: %d decode rows, %d prompt tokens", len(chunks) - len(prompt), sum(prompt)
            )
        prefills = any(c.num_tokens > 1 for c in chunks)
        self._threads.apply(prefills=prefills)
        if on_scheduled is not None:
            on_scheduled(chunks)
        burst = self._burst(out.scheduled, chunks, steps) if steps > 1 else None
        if burst is not None:
            return burst
        started = time.perf_counter()
        logits = execute_isolated(self._runner, chunks, layer_hook, layer_gate)
        if not prefills:
            self._time_decode(time.perf_counter() - started)
        for s, row in zip(out.scheduled, logits):
            if isinstance(row, Exception):
                s.seq.invalidate(
                    f"engine step failed for this request: {type(row).__name__}: {row}",
                    REQUEST_ERROR,
                )
        failed = [s.seq for s in out.scheduled if s.seq.invalid_reason]
        for s in out.scheduled:
            s.seq.num_computed_tokens += s.num_new_tokens
            if not s.seq.invalid_reason:
                self._kv.name_full_blocks(
                    s.seq.request_id, s.seq.block_hashes, s.seq.num_computed_tokens
                )
        ready = [
            (s.seq, row)
            for s, row in zip(out.scheduled, logits)
            if isinstance(row, torch.Tensor) and not s.seq.invalid_reason and row.shape[0]
        ]
        failures = [self._fail(seq, seq.invalid_reason, seq.error_kind) for seq in failed]
        return [*failures, *(self._sample(ready) if ready else [])]

    def _burst_steps(self, scheduled: list[ScheduledSeq]) -> int:
        """How many greedy decode steps this step may chain in one native call (1: none):
        every row decodes greedily with nothing per token but its stops (no logprobs,
        penalties, biases or grammar; no KV held to send), no request waits for a step; as
        many as the row with the fewest tokens left to make allows."""
        steps = burst_fits(self._bursts_up_to, self._decode_seconds)
        if steps < 2 or self._scheduler.waiting or not isinstance(self._runner, ModelRunner):
            return 1
        if not self._runner.burst_takes(len(scheduled)):
            return 1
        for s in scheduled:
            seq, params = s.seq, s.seq.params
            if s.num_new_tokens != 1 or is_prefilling(seq) or not bursts(params):
                return 1
            if seq.request_id in self._hold_kv or seq.invalid_reason:
                return 1
            left = min(
                params.max_tokens - seq.num_output_tokens, self._max_model_len - seq.num_tokens
            )
            steps = min(steps, left)
        return steps

    def _reserve_burst(self, scheduled: list[ScheduledSeq], steps: int) -> bool:
        """Blocks for each row's `steps` tokens of a burst; False where the pool is short of
        them (the step runs as usual then).

        NOTE: a row granted its blocks keeps them when a later one is refused: its next steps
        fill them."""
        return all(
            self._kv.allocate_slots(s.seq.request_id, s.seq.num_computed_tokens + steps)
            for s in scheduled
        )

    def _burst(
        self, scheduled: list[ScheduledSeq], chunks: list[SeqChunk], steps: int
    ) -> list[RequestOutput] | None:
        """`steps` decode steps of the scheduled rows (their blocks reserved) in one native
        call, each row's tokens taken as single steps would take them; None where the call
        failed: the step runs as usual then."""
        assert isinstance(self._runner, ModelRunner)
        started = time.perf_counter()
        try:
            tokens = self._runner.burst(chunks, steps, self._burst_stop)
            self._time_decode((time.perf_counter() - started) / len(tokens[0]))
        except Exception:  # the steps it wrote are rewritten by the usual steps
            log.exception("a burst of %d decode steps failed; a token a step from now", steps)
            self._bursts_up_to = 1  # NOTE: one log, not one a step, where it always fails
            return None
        return [self._take_burst(s.seq, row) for s, row in zip(scheduled, tokens)]

    def end_burst(self) -> None:
        """Ends a burst of decode steps in progress, or the next step's, after its current
        step (EngineLoop.call: a call, such as a new request, waits for no more than a
        step). Any thread."""
        self._burst_stop[0] = 1

    def _time_decode(self, seconds: float) -> None:
        """A decode-only step took `seconds`: the moving average bursts are sized by."""
        mean = self._decode_seconds
        self._decode_seconds = smoothed(mean, seconds) if mean else seconds

    def _take_burst(self, seq: Sequence, tokens: list[int]) -> RequestOutput:
        """A row's burst tokens, one at a time as steps take them (KV named, stops checked)
        up to the one that ends it, in one output."""
        taken: list[int] = []
        text = ""
        for token_id in tokens:
            seq.num_computed_tokens += 1
            self._kv.name_full_blocks(seq.request_id, seq.block_hashes, seq.num_computed_tokens)
            if token_id == SAMPLING_FAILED:
                out = self._sampling_failed(seq)
            else:
                out = self._append(seq, token_id, None)
            taken.extend(out.new_token_ids)
            text += out.new_text
            if out.finished:
                break
        return dataclasses.replace(out, new_token_ids=tuple(taken), new_text=text)

    def _fail(self, seq: Sequence, message: str, kind: str) -> RequestOutput:
        held = seq.request_id in self._hold_kv
        seq.error_kind = kind
        self._scheduler.finish(seq, "error", message, free_kv=not held)
        self._extras.pop(seq.request_id, None)
        return self._output(seq, (), "", None)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        """Run prompts to completion (blocking); for scripts, tests and benchmarks."""
        completions = {}
        for prompt in prompts:
            request_id = f"generate-{next(self._ids)}"
            self.add_request(request_id, prompt, params)
            completions[request_id] = Completion(request_id, list(prompt), [], "", None, None)
        while self.has_unfinished:
            for out in self.step():
                completions[out.request_id].add(out)
        return list(completions.values())

    def _chunk(self, s: ScheduledSeq) -> SeqChunk:
        seq, start = s.seq, s.seq.num_computed_tokens
        end = start + s.num_new_tokens
        return SeqChunk(
            seq.request_id,
            seq.token_ids[start:end],
            start,
            self._kv.block_ids(seq.request_id),
            int(end == seq.num_tokens),
        )

    def _sample(self, ready: list[tuple[Sequence, torch.Tensor]]) -> list[RequestOutput]:
        rows = ready[0][1] if len(ready) == 1 else torch.cat([row for _, row in ready])
        seqs = [seq for seq, _ in ready]
        token_ids, token_logprobs = self._runner.sample(
            rows,
            [s.params for s in seqs],
            [self._generator_for(s) for s in seqs],
            [self._history(s) if s.params.adjusts_logits else None for s in seqs],
            self._eos_token_ids,
        )
        return [
            self._sampling_failed(seq) if t == SAMPLING_FAILED else self._append(seq, t, lp)
            for seq, t, lp in zip(seqs, token_ids, token_logprobs)
        ]

    def _sampling_failed(self, seq: Sequence) -> RequestOutput:
        if seq.params.grammar is not None:  # the grammar left no token of this vocabulary
            return self._fail(seq, _unsatisfiable(None), UNSATISFIABLE_ERROR)
        return self._fail(seq, sampling_failure(seq.params), REQUEST_ERROR)

    def _generator_for(self, seq: Sequence) -> torch.Generator | None:
        """A seeded request's randomness depends on the token's position alone (so a
        recomputed or migrated request draws the same); others share the engine's."""
        if seq.params.greedy:
            return None
        if seq.params.seed is None:
            return self._generator
        return seeded_generator(seq.params.seed, seq.num_tokens, self._config.device)

    def _append(self, seq: Sequence, token_id: int, logprob: TokenLogprob | None) -> RequestOutput:
        extras = self._extras[seq.request_id]
        stop: _Stop | None = self.stop_reason(seq.params, token_id)
        if stop is None and extras.grammar is not None:
            try:
                extras.grammar.accept(token_id)
            except GrammarViolation as exc:  # no token of this vocabulary can go on
                return self._fail(seq, _unsatisfiable(exc), UNSATISFIABLE_ERROR)
        seq.append(token_id)
        text = ""
        if stop is None and extras.detokenizer is not None:
            # Stop strings count only from min_tokens on (vLLM's rule).
            matching = seq.num_output_tokens >= seq.params.min_tokens
            text = extras.stops.feed(extras.detokenizer.step(token_id), matching)
            stop = ("stop", extras.stops.matched) if extras.stops.matched else None
        stop = stop or self._length_stop(seq) or _grammar_stop(extras)
        if stop is not None:
            text += extras.stops.flush()
            held = seq.request_id in self._hold_kv
            self._scheduler.finish(seq, *stop, free_kv=not held)
            if held:
                self._held[seq.request_id] = seq
            del self._extras[seq.request_id]
        return self._output(seq, (token_id,), text, None if logprob is None else (logprob,))

    def _output(
        self,
        seq: Sequence,
        token_ids: tuple[int, ...],
        text: str,
        logprobs: tuple[TokenLogprob, ...] | None,
    ) -> RequestOutput:
        return RequestOutput(
            seq.request_id,
            token_ids,
            text,
            logprobs,
            seq.is_finished,
            seq.finish_reason,
            seq.stop_reason,
            seq.num_prompt_tokens,
            seq.num_cached_tokens,
            seq.num_output_tokens,
            seq.error_kind,
        )

    def stop_reason(self, params: SamplingParams, token_id: int) -> tuple[str, int] | None:
        """("stop", token) when `token_id` ends a request with these params (not length)."""
        if token_id in params.stop_token_ids or (
            not params.ignore_eos and token_id in self._eos_token_ids
        ):
            return "stop", token_id
        return None

    def _length_stop(self, seq: Sequence) -> _Stop | None:
        full = (
            seq.num_output_tokens >= seq.params.max_tokens or seq.num_tokens >= self._max_model_len
        )
        return ("length", None) if full else None

    def _history(self, seq: Sequence) -> History:
        grammar = self._extras[seq.request_id].grammar
        return History(seq.token_ids, seq.num_output_with_prior, seq.num_output_tokens, grammar)

    def _make_extras(self, seq: Sequence) -> _Extras:
        params = seq.params
        detokenizer = None
        if self._tokenizer is not None and self._config.detokenize:
            detokenizer = IncrementalDetokenizer(
                self._tokenizer, seq.token_ids, params.skip_special_tokens
            )
        return _Extras(detokenizer, StopStringMatcher(params.stop), self._grammars.matcher(seq))


def _unsatisfiable(violation: GrammarViolation | None) -> str:
    detail = f" ({str(violation).splitlines()[0]})" if violation is not None else ""
    return (
        "the output constraint cannot be met with this model's vocabulary: no token it "
        f"has can continue the output here{detail}"
    )


def _grammar_stop(extras: _Extras) -> _Stop | None:
    """A grammar that admits nothing more ends the request (no need to sample the EOS it
    would force)."""
    done = extras.grammar is not None and extras.grammar.is_finished
    return ("stop", None) if done else None


if TYPE_CHECKING:  # mypy holds LLMEngine to the interface services are typed with

    def _implements(engine: LLMEngine) -> EngineInterface:
        return engine
