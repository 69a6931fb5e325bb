"""Next-token choice from logits: greedy, temperature, min-p, top-k, top-p, seeds, logprobs.

A row that cannot be sampled (a NaN or +inf logit, every token masked to -inf, or no token
left with any probability) gets SAMPLING_FAILED instead of a token: the engine ends that
request alone, and every other row of the batch is sampled as usual.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy
import torch
import xxhash

from shared.logprob import TokenLogprob
from shared.model.kernels import loaded_cpu_ops
from shared.sampling_params import SamplingParams

SAMPLING_FAILED = -1  # in place of a token id: this row's distribution is unusable


def sample(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
) -> list[int]:
    """logits [B, vocab] float32 -> one token id per row, or SAMPLING_FAILED."""
    greedy, usable = _greedy_and_usable(logits)
    return [
        SAMPLING_FAILED
        if not usable[i]
        else greedy[i]
        if p.greedy
        else _sample_row(logits[i], p, generators[i])
        for i, p in enumerate(params)
    ]


def _greedy_and_usable(logits: torch.Tensor) -> tuple[list[int], list[bool]]:
    """Each row's argmax, and whether the row can be sampled at all: -inf is a masked token
    (penalties, biases, a grammar), NaN and +inf are broken. A row's max is NaN when any
    logit is, +inf when one is, -inf when all are masked: usable exactly when finite.
    One read of the logits and one device-to-host copy (on a GPU, one synchronisation)."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        native = loaded_cpu_ops()
        if native is not None and logits.is_contiguous():
            return native.greedy_rows(logits)  # kernels/greedy.cpp: one call, no numpy
        return _greedy_and_usable_numpy(logits)
    values, indices = row_max(logits, _slices(logits.shape[1]) if logits.is_cuda else 1)
    rows = torch.stack((indices, torch.isfinite(values).long())).tolist()
    return rows[0], [bool(u) for u in rows[1]]


def _greedy_and_usable_numpy(logits: torch.Tensor) -> tuple[list[int], list[bool]]:
    """_greedy_and_usable on the CPU: numpy's argmax (the first maximum, or the first NaN).
    Torch's max over a dimension took the sampling phase of a batch-1 step of the default
    model to 161-180 us, numpy's to 79-94 (`python -m bench step-phases`:
    docs/notes/2026-11-30-batch-1-decode-step.md, "A leaner decode step")."""
    rows = logits.detach().numpy()
    indices = rows.argmax(axis=1)
    values = rows[numpy.arange(rows.shape[0]), indices]
    return indices.tolist(), numpy.isfinite(values).tolist()


def row_max(logits: torch.Tensor, slices: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's max and the index of its first occurrence, over `slices` equal slices
    then their maxima. On a GPU one block reducing a 128k vocabulary alone takes ~27 us
    on an H200, a sizable share of a small model's decode step; 256 slices side by side,
    then their maxima, take a few."""
    if slices == 1:
        top = logits.max(dim=-1)
        return top.values, top.indices
    width = logits.shape[1] // slices
    part = logits.reshape(logits.shape[0], slices, width).max(dim=-1)
    values, best = part.values.max(dim=-1)  # the first slice holding the max: first index
    return values, best * width + part.indices.gather(1, best[:, None])[:, 0]


@functools.cache
def _slices(vocab: int, most: int = 256) -> int:
    """The most equal slices, up to `most`, that a vocabulary divides into."""
    return next(n for n in range(min(most, vocab), 0, -1) if vocab % n == 0)


def sampling_failure(params: SamplingParams) -> str:
    """Why a request got SAMPLING_FAILED: what its client sees."""
    return (
        f"sampling failed: the next-token distribution is broken (NaN or +inf) or empty "
        f"(temperature={params.temperature}, top_p={params.top_p}, top_k={params.top_k}, "
        f"min_p={params.min_p})"
    )


def seeded_generator(seed: int, position: int, device: str = "cpu") -> torch.Generator:
    """The randomness of a seeded request's token at `position` (tokens before it in the
    whole sequence). A pure function of the two, unlike one generator that advances with
    each draw: a request recomputed elsewhere from prompt + tokens so far, or decoded on
    another worker than the one that sampled its first token, draws the same numbers."""
    # NOTE: 63 bits, a non-negative int64: a seed every torch generator, on any device, takes.
    mixed = xxhash.xxh3_64_intdigest(f"{seed}:{position}".encode()) >> 1
    return torch.Generator(device=device).manual_seed(mixed)


def _sample_row(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> int:
    probs = _distribution(logits, params)
    if not (torch.isfinite(probs).all() and probs.sum() > 0):
        return SAMPLING_FAILED
    return int(torch.multinomial(probs, 1, generator=generator))


def _distribution(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Next-token probabilities after temperature, min-p, top-k and top-p (vLLM v1's
    order: min-p is an argmax-invariant processor run right after temperature)."""
    scaled = logits / params.temperature
    if params.min_p > 0:
        scaled = _min_p(scaled, params.min_p)
    if params.top_k > 0:
        kth = torch.topk(scaled, min(params.top_k, scaled.numel())).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if params.top_p < 1:
        probs = _top_p(probs, params.top_p)
    return probs


def _min_p(scaled: torch.Tensor, min_p: float) -> torch.Tensor:
    probs = torch.softmax(scaled, dim=-1)
    return scaled.masked_fill(probs < min_p * probs.max(), float("-inf"))


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    sorted_probs, order = probs.sort(descending=True)
    # Keep the smallest head whose mass reaches top_p (the first token always stays).
    outside = sorted_probs.cumsum(-1) - sorted_probs >= top_p
    outside[0] = False  # also when top_p is below float32's range (it reads as 0 there)
    sorted_probs = sorted_probs.masked_fill(outside, 0.0)
    return torch.zeros_like(probs).scatter_(0, order, sorted_probs)


def logprobs(
    logits: torch.Tensor, token_ids: Sequence[int], num_top: Sequence[int | None]
) -> list[TokenLogprob | None]:
    wanted = [i for i, n in enumerate(num_top) if n is not None and token_ids[i] != SAMPLING_FAILED]
    result: list[TokenLogprob | None] = [None] * len(token_ids)
    if not wanted:
        return result
    log_probs = torch.log_softmax(logits[wanted], dim=-1)
    for row, i in enumerate(wanted):
        k = num_top[i]
        top = torch.topk(log_probs[row], k) if k else None
        pairs = tuple(zip(top.indices.tolist(), top.values.tolist())) if top is not None else ()
        result[i] = TokenLogprob(token_ids[i], float(log_probs[row, token_ids[i]]), pairs)
    return result
