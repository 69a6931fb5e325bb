"""One request as the load generator (or the simulator) saw it: the unit every metric,
report and plot is computed from. Times are seconds; `start_time` counts from the run's
start (wall clock for `loadgen run`, virtual time for `loadgen sim`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class RequestRecord:
    index: int  # position in the dataset / trace
    start_time: float  # when it was sent (after any client-side queueing)
    input_len: int  # prompt tokens (usage.prompt_tokens when the server says)
    output_len: int = 0  # completion tokens (usage.completion_tokens)
    ttft: float | None = None  # first event with a non-empty `choices` - start_time
    itl: tuple[float, ...] = ()  # gaps between successive token events
    latency: float = 0.0  # E2EL: last token event - start_time
    status: int = 200  # HTTP status; 0 when no response came (connection error)
    error: str = ""  # empty on success
    queue_time: float = 0.0  # client-side wait on --max-concurrency before sending
    cached_tokens: int = 0  # usage.prompt_tokens_details.cached_tokens
    extra: dict = field(default_factory=dict)  # e.g. the simulator's placement facts

    @property
    def success(self) -> bool:
        return not self.error and self.ttft is not None

    @property
    def rejected(self) -> bool:
        """Turned away by admission (overload), as opposed to failed."""
        return self.status in (429, 503)

    @property
    def tpot(self) -> float:
        """vLLM's TPOT: (E2EL - TTFT) / (output tokens - 1); 0 for one-token answers."""
        if self.ttft is None or self.output_len <= 1:
            return 0.0
        return (self.latency - self.ttft) / (self.output_len - 1)

    def token_times(self) -> list[float]:
        """When each token event arrived, from the run's start."""
        if self.ttft is None:
            return []
        times = [self.start_time + self.ttft]
        for gap in self.itl:
            times.append(times[-1] + gap)
        return times

    def to_json(self) -> dict:
        out = asdict(self)
        out["itl"] = list(self.itl)
        return out

    @classmethod
    def from_json(cls, data: dict) -> RequestRecord:
        return cls(**{**data, "itl": tuple(data.get("itl", ()))})
