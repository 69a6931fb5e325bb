"""How one request is sampled and when it stops."""

from __future__ import annotations

from dataclasses import dataclass

from shared.errors import InvalidRequest

MAX_TOP_LOGPROBS = 20
# Temperatures below this sample greedily (vLLM's _SAMPLING_EPS): dividing logits by a
# smaller one overflows them (1e-320 is 0 in float32), and the result would be the argmax
# anyway.
SAMPLING_EPS = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0  # below SAMPLING_EPS (0 included) means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 (or -1) keeps the whole vocabulary
    min_p: float = 0.0  # drop tokens less likely than min_p x the likeliest one
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # None: no logprobs; n: the sampled token's plus the top n
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        checks = [
            (self.max_tokens >= 1, f"max_tokens must be at least 1, got {self.max_tokens}"),
            (self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}"),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"),
            (self.top_k >= -1, f"top_k must be -1, 0 or positive, got {self.top_k}"),
            (0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p}"),
            (all(self.stop), "stop strings must not be empty"),
            (
                self.logprobs is None or 0 <= self.logprobs <= MAX_TOP_LOGPROBS,
                f"logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {self.logprobs}",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidRequest(message)

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS or self.top_k == 1
