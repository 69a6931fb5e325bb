import pytest

from loadgen.sim.report import infinite_cache_hit_ratio, mooncake_tbt
from tests.loadgen.sim.builders import conversations, row


def test_the_ceiling_counts_blocks_seen_before_in_arrival_order():
    rows = [
        row(0, 1500, 1, prefix=(1, 2, 3)),
        row(1, 1500, 1, prefix=(1, 2, 4)),
        row(2, 500, 1, prefix=(5,)),
        row(3, 2000, 1, prefix=(1, 2, 3, 6)),
    ]
    assert infinite_cache_hit_ratio(rows) == pytest.approx(5 / 11)


def test_the_ceiling_is_one_minus_unique_over_total():
    rows = conversations(200)
    blocks = [h for r in rows for h in r.hash_ids]
    assert infinite_cache_hit_ratio(rows) == pytest.approx(1 - len(set(blocks)) / len(blocks))


def test_mooncake_tbt_is_the_mean_of_the_slowest_tenth():
    assert mooncake_tbt([0.01] * 18 + [1.0, 3.0]) == pytest.approx(2.0)
    assert mooncake_tbt([0.5]) == 0.5 and mooncake_tbt([]) == 0.0
