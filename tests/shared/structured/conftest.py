"""The real SmolLM2 tokenizer and one compiler for the whole structured-output suite, and a
small sampling loop: logits (random or the model's) masked by a matcher, then sampled."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from shared.model.tokenizer import Tokenizer
from shared.structured.compiler import GrammarCompiler
from shared.structured.logits import mask_logits_
from shared.structured.matcher import GrammarMatcher

QUOTE_TILT = 6.0  # on tokens with a quote: random strings end
STRUCTURE_TILT = 3.0  # on tokens with JSON punctuation: objects and arrays close


@pytest.fixture(scope="session")
def tokenizer(smollm2_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(smollm2_dir)


@pytest.fixture(scope="session")
def compiler(tokenizer: Tokenizer) -> GrammarCompiler:
    return GrammarCompiler(tokenizer)


@pytest.fixture(scope="session")
def random_logits(tokenizer: Tokenizer) -> Callable[[int], Callable[[list[int]], torch.Tensor]]:
    """Seeded random logits, tilted towards tokens with JSON punctuation so that random
    strings end and outputs close within a few hundred tokens."""
    texts = [tokenizer.decode([i], skip_special_tokens=False) for i in range(tokenizer.vocab_size)]
    tilt = torch.tensor([_tilt(text) for text in texts])

    def make(seed: int) -> Callable[[list[int]], torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        return lambda _: torch.randn(tokenizer.vocab_size, generator=generator) * 2 + tilt

    return make


def _tilt(text: str) -> float:
    if '"' in text:
        return QUOTE_TILT
    return STRUCTURE_TILT if any(c in text for c in "{}[],:") else 0.0


def sample_masked(
    matcher: GrammarMatcher,
    next_logits: Callable[[list[int]], torch.Tensor],
    eos_token_id: int,
    max_tokens: int = 400,
    seed: int = 0,
) -> list[int]:
    """Token ids sampled under the mask until EOS (included) or max_tokens."""
    generator = torch.Generator().manual_seed(seed)
    out: list[int] = []
    while len(out) < max_tokens and (not out or out[-1] != eos_token_id):
        row = mask_logits_(next_logits(out).float(), matcher)
        token = int(torch.multinomial(torch.softmax(row, dim=-1), 1, generator=generator))
        matcher.accept(token)
        out.append(token)
    return out
