"""How one request is sampled and when it stops."""

from __future__ import annotations

from dataclasses import dataclass

from shared.errors import InvalidRequest
from shared.structured.spec import GrammarSpec

MAX_TOP_LOGPROBS = 20
MAX_PENALTY = 2.0  # presence and frequency penalties lie in [-2, 2] (OpenAI's range)
MAX_LOGIT_BIAS = 100.0  # a bias lies in [-100, 100] (OpenAI's range)
# A repetition penalty divides or multiplies logits: bounded, so they stay finite.
REPETITION_PENALTY_RANGE = (0.01, 100.0)
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
    presence_penalty: float = 0.0  # subtracted once from every token already in the output
    frequency_penalty: float = 0.0  # subtracted per occurrence in the output
    repetition_penalty: float = 1.0  # divides (or multiplies, if negative) prompt+output logits
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit)
    min_tokens: int = 0  # EOS and stop tokens are masked, stop strings ignored, until then
    # The prompt's last tokens that are this request's own output from an earlier attempt
    # (a migrated request continues from prompt + output so far): penalties count them as
    # output, as the first attempt did.
    prior_output_tokens: int = 0
    grammar: GrammarSpec | None = None  # what the output must match (structured output)

    def __post_init__(self) -> None:
        checks = [
            (self.max_tokens >= 1, f"max_tokens must be at least 1, got {self.max_tokens}"),
            (self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}"),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"),
            (self.top_k >= -1, f"top_k must be -1, 0 or positive, got {self.top_k}"),
            (0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p}"),
            (all(self.stop), "stop strings must not be empty"),
            (
                abs(self.presence_penalty) <= MAX_PENALTY,
                f"presence_penalty must be in [-2, 2], got {self.presence_penalty}",
            ),
            (
                abs(self.frequency_penalty) <= MAX_PENALTY,
                f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}",
            ),
            (
                REPETITION_PENALTY_RANGE[0]
                <= self.repetition_penalty
                <= REPETITION_PENALTY_RANGE[1],
                f"repetition_penalty must be in [0.01, 100], got {self.repetition_penalty}",
            ),
            (
                all(abs(bias) <= MAX_LOGIT_BIAS for _, bias in self.logit_bias),
                "logit_bias values must be in [-100, 100]",
            ),
            # NOTE: min_tokens may exceed max_tokens here: a prefill worker samples one
            # token of a longer request (the gateway holds clients to min <= max).
            (self.min_tokens >= 0, f"min_tokens must be >= 0, got {self.min_tokens}"),
            (self.prior_output_tokens >= 0, "prior_output_tokens must be >= 0"),
            (
                self.logprobs is None or 0 <= self.logprobs <= MAX_TOP_LOGPROBS,
                f"logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {self.logprobs}",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidRequest(message)

    @property
    def adjusts_logits(self) -> bool:
        """Whether logits change before sampling (penalties, biases, a min_tokens mask)."""
        return bool(
            self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1.0
            or self.logit_bias
            or self.min_tokens
            or self.grammar is not None
        )

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS or self.top_k == 1
