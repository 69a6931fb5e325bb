"""Next-token choice from logits: greedy, temperature, top-k, top-p, seeds, logprobs."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from shared.engine.sampling_params import SamplingParams


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """Log-probability of the chosen token and of the most likely alternatives.

    Taken from the model's own distribution (before temperature, top-k and top-p).
    """
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def sample(logits: torch.Tensor, params: Sequence[SamplingParams],
           generators: Sequence[torch.Generator | None]) -> list[int]:
    """logits [B, vocab] float32 -> one token id per row."""
    greedy = logits.argmax(dim=-1).tolist()
    return [greedy[i] if p.greedy else _sample_row(logits[i], p, generators[i])
            for i, p in enumerate(params)]


def _sample_row(logits: torch.Tensor, params: SamplingParams,
                generator: torch.Generator | None) -> int:
    scaled = logits / params.temperature
    if params.top_k > 0:
        kth = torch.topk(scaled, min(params.top_k, scaled.numel())).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if params.top_p < 1:
        probs = _top_p(probs, params.top_p)
    return int(torch.multinomial(probs, 1, generator=generator))


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    sorted_probs, order = probs.sort(descending=True)
    # Keep the smallest head whose mass reaches top_p (the first token always stays).
    outside = sorted_probs.cumsum(-1) - sorted_probs >= top_p
    sorted_probs = sorted_probs.masked_fill(outside, 0.0)
    return torch.zeros_like(probs).scatter_(0, order, sorted_probs)


def logprobs(logits: torch.Tensor, token_ids: Sequence[int],
             num_top: Sequence[int | None]) -> list[TokenLogprob | None]:
    wanted = [i for i, n in enumerate(num_top) if n is not None]
    result: list[TokenLogprob | None] = [None] * len(token_ids)
    if not wanted:
        return result
    log_probs = torch.log_softmax(logits[wanted], dim=-1)
    for row, i in enumerate(wanted):
        top = torch.topk(log_probs[row], num_top[i]) if num_top[i] else None
        pairs = tuple(zip(top.indices.tolist(), top.values.tolist())) if top is not None else ()
        result[i] = TokenLogprob(token_ids[i], float(log_probs[row, token_ids[i]]), pairs)
    return result
