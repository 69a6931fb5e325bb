"""A sampled token's log-probability: what the engine returns and the gateway renders.

Kept apart from the sampler (torch) so the messages that carry it stay torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """Log-probability of the chosen token and of the most likely alternatives.

    Taken from the model's own distribution (before temperature, top-k and top-p).
    """

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
