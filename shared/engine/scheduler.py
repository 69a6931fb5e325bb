"""Continuous batching: which sequences run in the next step, and how many tokens each."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from shared.engine.sequence import SeqStatus, Sequence
from shared.kvcache.manager import KVCacheManager


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_batched_tokens: int = 2048  # token budget of one step (prefill chunks + decodes)
    max_num_seqs: int = 64
    enable_chunked_prefill: bool = True
    # The most prompt tokens one request computes in a step while other requests prefill
    # too (vLLM's long_prefill_token_threshold), so a long prompt shares each step with
    # the new ones instead of holding the whole budget. None: max(block size, a quarter
    # of the budget); 0: no limit (one prompt may take the budget while others wait).
    long_prefill_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)


class Scheduler:
    """Running sequences go first (decodes and unfinished prefill chunks), then new ones.

    Fair prefill (`long_prefill_tokens` > 0): decodes go before prefill chunks, and while
    more than one request is in its prefill (running or waiting), each computes at most
    `long_prefill_tokens` prompt tokens per step, so a short prompt arriving behind a long
    one joins the next step whole. A prompt prefilling alone takes the whole budget.

    When a running sequence cannot get a block, the most recently admitted one is
    preempted: its blocks are freed and it waits at the front, to be recomputed
    (its prefix blocks stay in the prefix cache, so recomputing is often cheap).
    """

    def __init__(self, config: SchedulerConfig, kv: KVCacheManager) -> None:
        self.config = config
        self.kv = kv
        self.prefill_chunk_cap = prefill_chunk_cap(config, kv.block_size)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        if self.prefill_chunk_cap:  # decodes first (stable: each kind keeps its order)
            self.running.sort(key=is_prefilling)
        limit = self._chunk_limit()
        budget = self._schedule_running(out, self.config.max_num_batched_tokens, limit)
        if not out.preempted:
            self._admit_waiting(out, budget, limit)
        return out

    def _chunk_limit(self) -> int:
        """The most tokens one sequence computes this step: the cap when several prefill."""
        budget = self.config.max_num_batched_tokens
        if not self.prefill_chunk_cap:
            return budget
        admissible = len(self.waiting) if len(self.running) < self.config.max_num_seqs else 0
        prefilling = admissible + sum(map(is_prefilling, self.running))
        return self.prefill_chunk_cap if prefilling > 1 else budget

    def finish(
        self, seq: Sequence, reason: str, stop_reason: str | int | None = None, free_kv: bool = True
    ) -> None:
        """End a sequence; with free_kv=False its blocks stay held until `kv.free`."""
        seq.finish(reason, stop_reason)
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        if free_kv:
            self.kv.free(seq.request_id)

    def adopt(self, seq: Sequence) -> None:
        """Run a sequence whose KV is already in its blocks (it arrived from elsewhere)."""
        seq.status = SeqStatus.RUNNING
        self.running.append(seq)

    def find(self, request_id: str) -> Sequence | None:
        for seq in (*self.running, *self.waiting):
            if seq.request_id == request_id:
                return seq
        return None

    def _schedule_running(self, out: SchedulerOutput, budget: int, limit: int) -> int:
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget, limit)
            if not self._make_room(seq, seq.num_computed_tokens + num_new, out):
                break
            out.scheduled.append(ScheduledSeq(seq, num_new))
            budget -= num_new
            i += 1
        return budget

    def _make_room(self, seq: Sequence, num_tokens: int, out: SchedulerOutput) -> bool:
        """Allocate for `seq`, preempting from the back; False if `seq` itself was preempted."""
        while not self.kv.allocate_slots(seq.request_id, num_tokens):
            victim = self.running.pop()
            self._preempt(victim)
            out.preempted.append(victim)
            if victim is seq:
                return False
        return True

    def preempt_all(self) -> None:
        """Send every running sequence back to wait for recomputation, in its order."""
        while self.running:
            self._preempt(self.running.pop())

    def _preempt(self, seq: Sequence) -> None:
        self.kv.free(seq.request_id)
        seq.num_computed_tokens = 0
        seq.num_external_tokens = 0  # freed with the table; recomputed (or re-hit) later
        seq.status = SeqStatus.WAITING
        self.waiting.appendleft(seq)

    def _admit_waiting(self, out: SchedulerOutput, budget: int, limit: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            cached, num_cached = self.prefix(seq)
            num_new = min(seq.num_tokens - num_cached, budget, limit)
            if num_new < seq.num_tokens - num_cached and not self.config.enable_chunked_prefill:
                return
            if not self.kv.allocate_slots(seq.request_id, num_cached + num_new, cached):
                return
            self.waiting.popleft()
            self._start(seq, num_cached)
            out.scheduled.append(ScheduledSeq(seq, num_new))
            budget -= num_new

    def prefix(self, seq: Sequence) -> tuple[list, int]:
        """Blocks to attach from the prefix cache, and how many tokens need no compute."""
        if seq.num_external_tokens:  # its table already holds them (see LLMEngine.reserve_prefix)
            return [], seq.num_external_tokens
        # NOTE: at least one token is always computed, for the logits of the next one.
        max_blocks = (seq.num_tokens - 1) // self.kv.block_size
        cached = self.kv.match_prefix(seq.block_hashes, max_blocks)
        return cached, len(cached) * self.kv.block_size

    def _start(self, seq: Sequence, num_cached: int) -> None:
        seq.num_computed_tokens = num_cached
        if seq.num_output_tokens == 0:
            seq.num_cached_tokens = num_cached
        seq.status = SeqStatus.RUNNING
        self.running.append(seq)


def is_prefilling(seq: Sequence) -> bool:
    """More than the one token of a decode step left to compute."""
    return seq.num_tokens - seq.num_computed_tokens > 1


def prefill_chunk_cap(config: SchedulerConfig, block_size: int) -> int:
    """`long_prefill_tokens` with its default filled in; 0 when prompts are not chunked."""
    if not config.enable_chunked_prefill:
        return 0
    if config.long_prefill_tokens is None:
        return max(block_size, config.max_num_batched_tokens // 4)
    return config.long_prefill_tokens
