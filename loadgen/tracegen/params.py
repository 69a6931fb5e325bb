"""A generated workload's parameters, with their defaults and checks.

Lengths are in tokens, times in seconds. Each request's prompt is made of:
- optionally, one of `system_prompts` shared prefixes (tool definitions, a document),
  chosen by Zipf popularity;
- for a first turn (or a single request), a new message of `input_mean` tokens on average
  (lognormal), or with probability `long_share` a long one of about `long_input`;
- for a later turn of a session, the previous turn's whole prompt, its answer and a new
  message of `turn_input_mean` tokens on average.
Prompts never exceed `input_max`: a session ends when its next prompt would.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from shared.errors import KvstackError

TUNABLE = ("system-tokens", "session-share")
DEFAULT_REQUESTS = 3000


@dataclass(frozen=True)
class GenParams:
    # how many, and when
    requests: int | None = None  # None: DEFAULT_REQUESTS, or as many as `duration` holds
    duration: float | None = None
    rate: float = 3.0  # requests/s, all turns counted
    burstiness: float = 1.0  # gamma shape of the gaps between new sessions; 1 = Poisson
    # lengths (lognormal: mean, and sigma of the underlying normal)
    input_mean: float = 4000.0
    input_sigma: float = 1.0
    input_max: int = 131072
    turn_input_mean: float = 400.0
    output_mean: float = 200.0
    output_sigma: float = 0.8
    output_max: int = 4096
    # multi-turn sessions
    session_share: float = 0.0  # share of requests that belong to a multi-turn session
    turns_mean: float = 4.0  # turns per session: 1 + geometric, at least 2
    think_time: float = 30.0  # mean gap between a session's turns (exponential)
    # shared prefixes
    system_prompts: int = 0
    system_tokens: int = 2048  # mean length of a shared prefix
    system_sigma: float = 0.0  # spread of their lengths (lognormal sigma); 0 = all equal
    system_zipf: float = 1.0  # popularity exponent: prefix k is chosen ~ 1/(k+1)^s
    system_share: float = 1.0  # share of sessions and single requests that use one
    # long-context outliers
    long_share: float = 0.0  # share of first messages that are long
    long_input: int = 65536
    # reuse
    target_reuse: float | None = None
    tune: str | None = None  # None: system-tokens with shared prefixes, else session-share
    seed: int = 0

    def check(self) -> GenParams:
        """Self, or a KvstackError naming the first bad flag."""
        for rule, name, why in self._rules():
            if not rule:
                raise KvstackError(f"--{name.replace('_', '-')} {why}, got {getattr(self, name)}")
        return self

    def _rules(self) -> list[tuple[bool, str, str]]:
        return [
            (self.requests is None or self.requests > 0, "requests", "must be positive"),
            (self.duration is None or _positive(self.duration), "duration", "must be positive"),
            (_positive(self.rate), "rate", "must be a positive number"),
            (_positive(self.burstiness), "burstiness", "must be a positive number"),
            (_positive(self.input_mean), "input_mean", "must be positive"),
            (_positive(self.turn_input_mean), "turn_input_mean", "must be positive"),
            (_positive(self.output_mean), "output_mean", "must be positive"),
            (self.input_sigma >= 0, "input_sigma", "must be >= 0"),
            (self.output_sigma >= 0, "output_sigma", "must be >= 0"),
            (self.system_sigma >= 0, "system_sigma", "must be >= 0"),
            (self.input_max >= 2, "input_max", "must be at least 2"),
            (self.output_max >= 1, "output_max", "must be at least 1"),
            (0 <= self.session_share < 1, "session_share", "must be in [0, 1)"),
            (self.turns_mean >= 2, "turns_mean", "must be at least 2"),
            (self.think_time > 0, "think_time", "must be positive"),
            (self.system_prompts >= 0, "system_prompts", "must be >= 0"),
            (0 < self.system_tokens < self.input_max, "system_tokens", "must be in (0, input max)"),
            (self.system_zipf >= 0, "system_zipf", "must be >= 0"),
            (0 <= self.system_share <= 1, "system_share", "must be in [0, 1]"),
            (0 <= self.long_share <= 1, "long_share", "must be in [0, 1]"),
            (0 < self.long_input <= self.input_max, "long_input", "must be in (0, input max]"),
            (
                self.target_reuse is None or 0 <= self.target_reuse < 1,
                "target_reuse",
                "must be in [0, 1)",
            ),
            (self.tune is None or self.tune in TUNABLE, "tune", f"must be one of {TUNABLE}"),
            (self.seed >= 0, "seed", "must be >= 0"),
        ]

    @property
    def uses_prefixes(self) -> bool:
        return self.system_prompts > 0 and self.system_share > 0

    @property
    def knob(self) -> str:
        """What --target-reuse tunes."""
        if self.tune is not None:
            return self.tune
        return "system-tokens" if self.uses_prefixes else "session-share"


def _positive(value: float) -> bool:
    return value > 0 and math.isfinite(value)


FIELDS = tuple(f.name for f in fields(GenParams))
