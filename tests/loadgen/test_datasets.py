"""Datasets: lengths, token ranges, shared prefixes, and trace blocks per hash id."""

from __future__ import annotations

import numpy as np
import pytest

from loadgen import datasets
from loadgen.datasets import FIRST_SAFE_TOKEN_ID, TokenSpace
from loadgen.trace import TraceRow
from shared.errors import KvstackError

SPACE = TokenSpace(vocab_size=2000)


def test_random_lengths_spread_uniformly_around_the_target() -> None:
    prompts = datasets.random_prompts(400, 100, 20, 0.5, SPACE, seed=1)
    inputs = [p.input_len for p in prompts]
    assert min(inputs) >= 50 and max(inputs) <= 150 and len(set(inputs)) > 50
    assert all(len(p.prompt) == p.input_len for p in prompts)
    assert all(10 <= p.output_len <= 30 for p in prompts)
    assert [p.index for p in prompts] == list(range(400))


def test_random_exact_lengths_and_safe_ids() -> None:
    prompts = datasets.random_prompts(5, 32, 8, 0.0, SPACE, seed=0)
    ids = np.concatenate([p.prompt for p in prompts])
    assert {(p.input_len, p.output_len) for p in prompts} == {(32, 8)}
    assert ids.min() >= FIRST_SAFE_TOKEN_ID and ids.max() < 2000
    assert all(p.arrival is None for p in prompts)


def test_seed_decides_the_prompts() -> None:
    a, b, c = (datasets.random_prompts(3, 16, 4, 0.0, SPACE, seed=s) for s in (0, 0, 1))
    assert all(np.array_equal(x.prompt, y.prompt) for x, y in zip(a, b))
    assert not np.array_equal(a[0].prompt, c[0].prompt)


def test_text_prompts_for_chat_have_one_word_per_token() -> None:
    prompt = datasets.random_prompts(1, 24, 4, 0.0, TokenSpace(as_text=True), seed=0)[0]
    assert isinstance(prompt.prompt, str) and len(prompt.prompt.split()) == 24


def test_shared_prefix_groups() -> None:
    prompts = datasets.shared_prefix_prompts(
        3, 4, prefix_len=20, suffix_len=5, output_len=7, space=SPACE, seed=0
    )
    assert len(prompts) == 12 and {p.input_len for p in prompts} == {25}
    prefixes = {tuple(p.prompt[:20]) for p in prompts}
    suffixes = {tuple(p.prompt[20:]) for p in prompts}
    assert len(prefixes) == 3 and len(suffixes) == 12
    groups = [tuple(p.prompt[:20]) for p in prompts]
    assert groups != sorted(groups, key=groups.index)  # shuffled: groups interleave


@pytest.mark.parametrize(
    "call",
    [
        lambda: datasets.random_prompts(0, 8, 8, 0.0, SPACE, 0),
        lambda: datasets.random_prompts(2, 8, 8, 1.0, SPACE, 0),
        lambda: datasets.shared_prefix_prompts(1, 1, 0, 1, 1, SPACE, 0),
        lambda: TokenSpace(vocab_size=500),
    ],
)
def test_bad_sizes_are_clear_errors(call) -> None:
    with pytest.raises(KvstackError):
        call()


# -- traces ---------------------------------------------------------------------------------------

ROWS = [
    TraceRow(0.0, 1100, 40, (1, 2, 3)),  # 512 + 512 + 76
    TraceRow(0.5, 1030, 3, (1, 2, 9)),  # shares blocks 1 and 2, last block 6 tokens
    TraceRow(1.0, 700, 10, ()),
]  # no ids: shares nothing


def test_equal_hash_ids_give_equal_blocks_at_full_length() -> None:
    a, b, c = datasets.trace_prompts(ROWS, 1.0, SPACE, seed=0)
    assert (a.input_len, b.input_len, c.input_len) == (1100, 1030, 700)
    assert len(a.prompt) == 1100 and len(b.prompt) == 1030 and len(c.prompt) == 700
    assert np.array_equal(a.prompt[:1024], b.prompt[:1024])
    assert not np.array_equal(a.prompt[1024:1030], b.prompt[1024:1030])
    assert (a.arrival, b.arrival, c.output_len) == (0.0, 0.5, 10)


def test_length_scale_shrinks_blocks_and_keeps_sharing() -> None:
    a, b, c = datasets.trace_prompts(ROWS, 0.05, SPACE, seed=0)
    block = datasets.scaled_block_size(0.05)
    assert block == 26  # round(512 * 0.05)
    assert a.input_len == 2 * block + 4  # last block: round(76 * 0.05) = 4
    assert b.input_len == 2 * block + 1  # round(6 * 0.05) = 0, at least 1
    assert np.array_equal(a.prompt[: 2 * block], b.prompt[: 2 * block])
    assert (a.output_len, b.output_len, c.output_len) == (2, 1, 1)  # at least 1
    assert c.input_len == 35 == len(c.prompt)


def test_last_block_is_cut_to_the_input_length() -> None:
    row = TraceRow(0.0, 513, 1, (5, 6))
    prompt = datasets.trace_prompts([row], 1.0, SPACE, seed=0)[0]
    block_6 = datasets.BlockTokens(SPACE, 512, seed=0).block(6)
    assert len(prompt.prompt) == 513 and prompt.prompt[-1] == block_6[0]


def test_blocks_depend_on_the_seed_not_on_the_row() -> None:
    first = datasets.BlockTokens(SPACE, 16, seed=0)
    again = datasets.BlockTokens(SPACE, 16, seed=0)
    other = datasets.BlockTokens(SPACE, 16, seed=1)
    assert np.array_equal(first.block(42), again.block(42))
    assert not np.array_equal(first.block(42), other.block(42))
    assert not np.array_equal(first.block(42), first.block(43))


def test_traces_need_token_ids() -> None:
    with pytest.raises(KvstackError, match="completions"):
        datasets.trace_prompts(ROWS, 1.0, TokenSpace(as_text=True), seed=0)
    with pytest.raises(KvstackError, match="length-scale"):
        datasets.trace_prompts(ROWS, 0.0, SPACE, seed=0)
