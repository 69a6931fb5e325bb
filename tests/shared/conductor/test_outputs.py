"""Output lengths learned from finished requests, overall and per first block."""

from __future__ import annotations

import pytest

from shared.conductor import outputs as outputs_module
from shared.conductor.outputs import OutputLengths
from shared.messages import RequestDone


def done(first_block: int, num_output: int, tbt: float = 0.05) -> RequestDone:
    return RequestDone("r", first_block, 100, num_output, 0.5, tbt)


def test_before_anything_finishes_the_defaults_hold() -> None:
    lengths = OutputLengths(default_decode_time=20.0)
    assert lengths.uniform_decode_time() == 20.0
    assert lengths.expected_tokens(7, 300) == 300.0


def test_one_finished_request_sets_both_estimates() -> None:
    lengths = OutputLengths(20.0)
    lengths.observe(done(7, 40, tbt=0.05))
    assert lengths.uniform_decode_time() == pytest.approx(2.0)
    assert lengths.expected_tokens(7, 300) == 40.0


def test_expected_tokens_never_exceed_max_tokens() -> None:
    lengths = OutputLengths(20.0)
    lengths.observe(done(7, 40))
    assert lengths.expected_tokens(7, 10) == 10.0


def test_later_observations_move_the_average_by_the_smoothing_weight() -> None:
    lengths = OutputLengths(20.0)
    lengths.observe(done(7, 40))
    lengths.observe(done(7, 90))
    assert outputs_module.SMOOTHING == 0.2
    assert lengths.expected_tokens(7, 300) == pytest.approx(0.8 * 40 + 0.2 * 90)


def test_an_unseen_prefix_expects_the_overall_average() -> None:
    lengths = OutputLengths(20.0)
    lengths.observe(done(7, 40))
    lengths.observe(done(8, 100))
    assert lengths.expected_tokens(9, 300) == pytest.approx(0.8 * 40 + 0.2 * 100)
    assert lengths.expected_tokens(8, 300) == 100.0


def test_a_request_without_blocks_is_learned_only_overall() -> None:
    lengths = OutputLengths(20.0)
    lengths.observe(done(0, 40))
    assert not lengths.by_prefix and lengths.expected_tokens(0, 300) == 40.0


def test_the_least_recently_seen_prefix_is_forgotten_first(monkeypatch) -> None:
    monkeypatch.setattr(outputs_module, "MAX_PREFIXES", 2)
    lengths = OutputLengths(20.0)
    for first_block in (1, 2, 1, 3):
        lengths.observe(done(first_block, 10 * first_block))
    assert list(lengths.by_prefix) == [1, 3]
