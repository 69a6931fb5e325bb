"""Prefill's prefix-cache counters split a prompt's cached tokens by tier: what the plan
fetched counts for its source, the rest for the local cache."""

from __future__ import annotations

from shared.prefill.metrics import PrefixCounters
from shared.prefill.prefix import KVSTORE, PrefixPlan
from shared.prefill.timing import cached_by_tier
from shared.runtime.metrics import Metrics


def hits(counters: PrefixCounters) -> dict[str, float]:
    return {tier: counters.hits.labels(tier)._value.get() for tier in ("local", "kvstore", "peer")}


def test_fetched_tokens_count_for_their_source_and_the_rest_for_the_local_cache() -> None:
    counters = PrefixCounters.of(Metrics("prefill"))
    counters.count(100, cached_by_tier(64, PrefixPlan(1, 3, KVSTORE), block_size=16))
    counters.count(100, cached_by_tier(32, PrefixPlan(0, 2, "prefill-1"), block_size=16))
    # nothing fetched: the engine matched locally
    counters.count(100, cached_by_tier(48, None, block_size=16))
    assert hits(counters) == {"local": 16 + 48, "kvstore": 48, "peer": 32}
    assert counters.queries._value.get() == 300


def test_every_tier_is_exposed_before_any_hit() -> None:
    metrics = Metrics("prefill")
    PrefixCounters.of(metrics)
    samples = {
        s.labels.get("tier")
        for family in metrics.registry.collect()
        for s in family.samples
        if s.name == "kvstack_prefill_prefix_cache_hits_total"
    }
    assert samples == {"local", "kvstore", "peer"}


def test_a_whole_prefix_fetch_counts_its_bytes_and_seconds_by_tier() -> None:
    counters = PrefixCounters.of(Metrics("prefill"))
    counters.loaded("kvstore", 2_000_000_000, 2.0)  # 1 GB/s
    counters.loaded("peer", 500_000_000, 0.1)  # 5 GB/s
    counters.loaded("kvstore", 0, 0.0)  # a fetch that did not land whole: nothing
    assert counters.load_bytes.labels("kvstore")._value.get() == 2_000_000_000
    assert counters.load_bytes.labels("peer")._value.get() == 500_000_000
    seconds = counters.load_seconds.labels("kvstore")
    assert seconds._sum.get() == 2.0 and sum(b.get() for b in seconds._buckets) == 1
