"""One trace request on its way through the simulated cluster."""

from __future__ import annotations

from dataclasses import dataclass, field

from loadgen.trace import TRACE_BLOCK_SIZE, TraceRow
from shared.messages import Placement
from shared.prefill.prefix import NO_PREFIX, PrefixPlan


@dataclass(slots=True, eq=False)
class Job:
    """A request's state and times (virtual seconds). Mutable: the nodes fill it in."""

    index: int
    request_id: str
    row: TraceRow
    arrival: float
    placement: Placement | None = None
    prefill_id: str = ""
    decode_id: str = ""
    plan: PrefixPlan = NO_PREFIX
    expected_seconds: float = 0.0  # its prefill as predicted when it was queued
    expected_tokens: int = 0  # the prompt's tokens to compute, as predicted then
    prefill_start: float = 0.0  # when its node started on it (fetch, then compute)
    fetch_seconds: float = 0.0  # loading the remote prefix
    compute_seconds: float = 0.0  # computing the rest of the prompt
    held_blocks: int = 0  # the prompt's first blocks its decode node held: not streamed there
    pool_blocks: int = 0  # the next ones it got from the pool itself: not streamed either
    reserved_at: float = 0.0  # when its decode node reserved (and began that get)
    first_token: float | None = None
    join_step: int = -1  # the first decode step it takes part in, on its node
    token_ends: list[float] = field(default_factory=list)  # decode step ends: tokens 2..
    status: int = 200
    error: str = ""
    wasted: bool = False  # prefilled, then refused by the decode node (baseline)

    @property
    def num_prompt_tokens(self) -> int:
        return self.row.input_length

    @property
    def num_output_tokens(self) -> int:
        return self.row.output_length

    @property
    def final_tokens(self) -> int:
        """KV tokens it holds on its decode node when done: prompt and output."""
        return self.row.input_length + self.row.output_length

    @property
    def busy_seconds(self) -> float:
        """What its prefill cost its prefill node."""
        return self.fetch_seconds + self.compute_seconds

    @property
    def prefix_tokens(self) -> int:
        return min(self.plan.blocks * TRACE_BLOCK_SIZE, self.num_prompt_tokens - 1)

    @property
    def last_token(self) -> float | None:
        return self.token_ends[-1] if self.token_ends else self.first_token

    @property
    def mean_gap(self) -> float:
        """Seconds between its tokens after the first, on average (0: one token, or none
        yet): the TBT the gateway reports for it."""
        first, last, n = self.first_token, self.last_token, self.num_output_tokens
        if first is None or last is None or n < 2:
            return 0.0
        return (last - first) / (n - 1)
