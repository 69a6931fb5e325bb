"""Rotary tables: a CPU step reads rows of precomputed cos and sin, which must be what the
formula gives for each position (the fused step and the module path read the same rows)."""

from __future__ import annotations

import pytest
import torch

from shared.model.config import RopeConfig
from shared.model.rope import TABLE_MIN_ROWS, RotaryEmbedding


def formula(rotary: RotaryEmbedding, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
    freqs = positions.float()[:, None] * rotary.inv_freq[None, :]
    return freqs.cos(), freqs.sin()


@pytest.mark.parametrize("head_dim", [16, 64, 80, 128])
@pytest.mark.parametrize(
    "rope", [RopeConfig(), RopeConfig(theta=500000.0, type="llama3", factor=8.0)]
)
def test_table_rows_are_the_formulas_values_bit_for_bit(head_dim, rope) -> None:
    rotary = RotaryEmbedding(rope, head_dim)
    gen = torch.Generator().manual_seed(0)
    for batch in (1, 1, 3, 5, 16):  # one row as a decode step asks, then several
        positions = torch.randint(0, 3 * TABLE_MIN_ROWS, (batch,), generator=gen)
        for got, want in zip(rotary.cos_sin(positions), formula(rotary, positions), strict=True):
            assert torch.equal(got, want)
    cos, sin = rotary.tables(1)
    rows = torch.arange(cos.shape[0])
    assert torch.equal(cos, formula(rotary, rows)[0]) and torch.equal(sin, formula(rotary, rows)[1])


def test_tables_grow_to_what_is_asked_and_never_shrink() -> None:
    rotary = RotaryEmbedding(RopeConfig(), 64)
    assert rotary.tables(1)[0].shape == (TABLE_MIN_ROWS, 32)
    grown = rotary.tables(TABLE_MIN_ROWS + 1)[0].shape[0]
    assert grown >= TABLE_MIN_ROWS + 1 and grown % TABLE_MIN_ROWS == 0
    assert rotary.tables(3)[0].shape[0] == grown  # kept, not rebuilt smaller
    far = 10 * TABLE_MIN_ROWS + 7
    assert rotary.tables(far)[0].shape[0] >= far
    positions = torch.tensor([far - 1])
    assert torch.equal(rotary.cos_sin(positions)[0], formula(rotary, positions)[0])
