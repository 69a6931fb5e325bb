"""Applies a grammar's mask to logits rows: what the sampler calls before sampling."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from shared.structured.matcher import GrammarMatcher

# NOTE: a masked logit is -inf by default, as in vLLM; a sampler that rejects rows with
# non-finite logits (a model that blew up) must check before masking, or mask with this
# instead: it is finite, and still has probability 0 after softmax at any temperature.
FINITE_FILL = torch.finfo(torch.float32).min


def mask_logits_(
    row: torch.Tensor, matcher: GrammarMatcher, fill: float = float("-inf")
) -> torch.Tensor:
    """Set to -inf, in place, every logit of a [vocab] row the grammar forbids next; returns
    the row. Columns past the tokenizer's vocabulary (a model's padded logits) are forbidden."""
    bits = np.unpackbits(matcher.bitmask().view(np.uint8), bitorder="little")
    width = min(row.shape[-1], matcher.vocab_size)
    forbidden = torch.from_numpy(bits[:width] == 0).to(row.device)
    row[:width].masked_fill_(forbidden, fill)
    row[width:] = fill
    return row


def mask_batch_(
    logits: torch.Tensor,
    matchers: Sequence[GrammarMatcher | None],
    fill: float = float("-inf"),
) -> torch.Tensor:
    """mask_logits_ on each row of [B, vocab] whose request has a grammar (None: no grammar)."""
    for row, matcher in zip(logits, matchers):
        if matcher is not None:
            mask_logits_(row, matcher, fill)
    return logits
