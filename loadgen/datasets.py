"""Datasets: what `loadgen run` sends, as a list of `Prompt`s.

- `random`: unique random prompts with lengths spread uniformly around `input_len` /
  `output_len` (vLLM's `--random-range-ratio`).
- `shared-prefix`: groups that share a common prefix, each prompt with its own suffix
  (SGLang's `generated-shared-prefix`).
- `mooncake-trace`: one prompt per trace row, its arrival the row's timestamp. Each hash id
  becomes one fixed block of token ids drawn from a generator seeded by (seed, hash id), so
  equal ids give equal blocks and rows that share ids share a prefix, as in the trace.

Token ids are drawn from [FIRST_SAFE_TOKEN_ID, vocab_size): ids below 1000 hold the special
and byte tokens of the common tokenizers (SmolLM2's specials are 0-16, Llama-2's bytes
3-258), and the default vocab size of 32000 fits Llama-2, Mistral, SmolLM2 (49152), Qwen
and Llama-3 alike.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from loadgen.trace import TRACE_BLOCK_SIZE, TraceRow
from shared.errors import KvstackError

FIRST_SAFE_TOKEN_ID = 1000
DEFAULT_VOCAB_SIZE = 32000
# One token each in the common BPE vocabularies (with the leading space the join adds), so a
# chat prompt of N words is about N tokens before the chat template.
WORDS = (
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "are",
    "with",
    "as",
    "by",
    "at",
    "from",
    "his",
    "an",
    "were",
    "this",
    "all",
    "have",
    "not",
    "but",
    "they",
    "her",
    "which",
    "one",
    "you",
    "had",
    "their",
    "there",
    "been",
    "has",
    "more",
    "when",
    "who",
    "will",
    "would",
    "time",
    "can",
    "said",
    "each",
    "new",
    "some",
    "about",
    "them",
    "only",
    "year",
    "other",
    "into",
    "two",
    "may",
    "after",
    "first",
    "many",
    "most",
    "over",
    "these",
    "then",
    "also",
    "made",
    "its",
    "could",
    "people",
    "work",
    "such",
    "back",
    "water",
    "long",
    "day",
    "part",
    "where",
    "used",
    "right",
    "state",
    "world",
    "house",
    "point",
    "place",
    "city",
    "school",
    "small",
    "number",
    "great",
    "life",
    "system",
    "group",
    "home",
    "music",
    "light",
    "story",
    "paper",
    "power",
    "money",
    "space",
    "order",
    "table",
    "market",
    "field",
    "model",
    "court",
    "price",
)


@dataclass(frozen=True)
class Prompt:
    index: int
    prompt: np.ndarray | str  # token ids, int32 (completions), or text (chat)
    input_len: int  # tokens we meant to send (the server's count may differ)
    output_len: int  # max_tokens
    arrival: float | None = None  # seconds after the start (traces); None: the schedule's


@dataclass(frozen=True)
class TokenSpace:
    """Where prompt token ids come from; `as_text`: send words instead (chat)."""

    vocab_size: int = DEFAULT_VOCAB_SIZE
    as_text: bool = False

    def __post_init__(self) -> None:
        if self.vocab_size <= FIRST_SAFE_TOKEN_ID:
            raise KvstackError(
                f"--vocab-size must be above {FIRST_SAFE_TOKEN_ID} (ids below "
                f"it are left out as special tokens), got {self.vocab_size}"
            )

    def draw(self, rng: np.random.Generator, length: int) -> np.ndarray:
        return rng.integers(FIRST_SAFE_TOKEN_ID, self.vocab_size, size=length, dtype=np.int32)

    def render(self, ids: np.ndarray) -> np.ndarray | str:
        """The prompt as sent: the ids, or one word per id for text endpoints."""
        if not self.as_text:
            return ids
        return " ".join(WORDS[i % len(WORDS)] for i in ids.tolist())


# -- random --------------------------------------------------------------------------------------


def spread(rng: np.random.Generator, length: int, range_ratio: float, count: int) -> list[int]:
    """`count` lengths uniform in [length*(1-r), length*(1+r)], at least 1 (vLLM's rule)."""
    low = max(1, math.floor(length * (1 - range_ratio)))
    high = max(low, math.ceil(length * (1 + range_ratio)))
    return rng.integers(low, high + 1, size=count).tolist()


def random_prompts(
    num_prompts: int,
    input_len: int,
    output_len: int,
    range_ratio: float,
    space: TokenSpace,
    seed: int,
) -> list[Prompt]:
    _check_positive(num_prompts=num_prompts, input_len=input_len, output_len=output_len)
    if not 0 <= range_ratio < 1:
        raise KvstackError(f"--range-ratio must be in [0, 1), got {range_ratio}")
    rng = np.random.default_rng(seed)
    inputs = spread(rng, input_len, range_ratio, num_prompts)
    outputs = spread(rng, output_len, range_ratio, num_prompts)
    return [
        Prompt(i, space.render(space.draw(rng, n_in)), n_in, n_out)
        for i, (n_in, n_out) in enumerate(zip(inputs, outputs))
    ]


# -- shared prefix -------------------------------------------------------------------------------


def shared_prefix_prompts(
    num_groups: int,
    prompts_per_group: int,
    prefix_len: int,
    suffix_len: int,
    output_len: int,
    space: TokenSpace,
    seed: int,
) -> list[Prompt]:
    """Prompts in a seeded shuffled order, so groups interleave as users' requests do."""
    _check_positive(
        num_groups=num_groups,
        prompts_per_group=prompts_per_group,
        prefix_len=prefix_len,
        suffix_len=suffix_len,
        output_len=output_len,
    )
    rng = np.random.default_rng(seed)
    prefixes = [space.draw(rng, prefix_len) for _ in range(num_groups)]
    ids = [
        np.concatenate([prefix, space.draw(rng, suffix_len)])
        for prefix in prefixes
        for _ in range(prompts_per_group)
    ]
    order = rng.permutation(len(ids)).tolist()
    return [
        Prompt(i, space.render(ids[j]), prefix_len + suffix_len, output_len)
        for i, j in enumerate(order)
    ]


# -- Mooncake traces -----------------------------------------------------------------------------


def scaled_block_size(length_scale: float) -> int:
    return max(1, round(TRACE_BLOCK_SIZE * length_scale))


def scaled_input_len(row: TraceRow, length_scale: float) -> int:
    """Whole blocks stay whole (so prefix sharing is kept); the partial last one scales."""
    if not row.hash_ids:
        return max(1, round(row.input_length * length_scale))
    block = scaled_block_size(length_scale)
    last = row.input_length - TRACE_BLOCK_SIZE * (len(row.hash_ids) - 1)
    return block * (len(row.hash_ids) - 1) + min(block, max(1, round(last * length_scale)))


def scaled_output_len(row: TraceRow, length_scale: float) -> int:
    return max(1, round(row.output_length * length_scale))


class BlockTokens:
    """The token ids of each hash id's block, made once per id."""

    def __init__(self, space: TokenSpace, block_size: int, seed: int) -> None:
        self.space, self.block_size, self.seed = space, block_size, seed
        self._blocks: dict[int, np.ndarray] = {}

    def block(self, hash_id: int) -> np.ndarray:
        if hash_id not in self._blocks:
            rng = np.random.default_rng([self.seed, hash_id])
            self._blocks[hash_id] = self.space.draw(rng, self.block_size)
        return self._blocks[hash_id]

    def prompt(self, hash_ids: Sequence[int], length: int) -> np.ndarray:
        return np.concatenate([self.block(hash_id) for hash_id in hash_ids])[:length]


def trace_prompts(
    rows: Sequence[TraceRow], length_scale: float, space: TokenSpace, seed: int
) -> list[Prompt]:
    if space.as_text:
        raise KvstackError(
            "mooncake-trace prompts are token ids and need --endpoint "
            "completions (chat takes text only)"
        )
    if not 0 < length_scale <= 1:
        raise KvstackError(f"--length-scale must be in (0, 1], got {length_scale}")
    blocks = BlockTokens(space, scaled_block_size(length_scale), seed)
    return [_trace_prompt(index, row, length_scale, blocks, seed) for index, row in enumerate(rows)]


def _trace_prompt(
    index: int, row: TraceRow, length_scale: float, blocks: BlockTokens, seed: int
) -> Prompt:
    length = scaled_input_len(row, length_scale)
    if row.hash_ids:
        ids = blocks.prompt(row.hash_ids, length)
    else:  # a row without ids shares nothing: tokens of its own
        ids = blocks.space.draw(np.random.default_rng([seed, 2**32 + index]), length)
    return Prompt(index, ids, length, scaled_output_len(row, length_scale), row.timestamp)


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise KvstackError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
