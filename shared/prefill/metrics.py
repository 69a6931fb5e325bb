"""A prefill worker's prefix-cache counters, in prompt tokens as vLLM's
(`prefix_cache_queries_total`, `prefix_cache_hits_total`), with the tier each hit came
from: its own cache ("local"), the kvstore pool ("kvstore"), or a peer prefill worker
("peer"). Counted once a prompt's KV went out whole, so a failed load counts nothing."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import Counter, Histogram

from shared.runtime.metrics import Metrics

TIERS = ("local", "kvstore", "peer")
LOADED_FROM = ("kvstore", "peer")
LOAD_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


@dataclass(frozen=True)
class PrefixCounters:
    queries: Counter
    hits: Counter
    load_bytes: Counter
    load_seconds: Histogram  # with load_bytes: GB/s, rate(bytes) / rate(seconds' sum)

    @classmethod
    def of(cls, metrics: Metrics) -> PrefixCounters:
        hits = metrics.counter(
            "prefix_cache_hits",
            "prompt tokens whose KV was found in a prefix cache, by tier",
            ("tier",),
        )
        for tier in TIERS:  # every tier's series exists from the start, at 0
            hits.labels(tier)
        queries = metrics.counter(
            "prefix_cache_queries", "prompt tokens looked up in the prefix caches"
        )
        load_bytes = metrics.counter(
            "prefix_load_bytes", "KV bytes of prefixes fetched whole, by tier", ("tier",)
        )
        load_seconds = metrics.histogram(
            "prefix_load_seconds",
            "each prefix fetched whole: its start to its last layer landed, by tier",
            LOAD_SECONDS_BUCKETS,
            ("tier",),
        )
        for tier in LOADED_FROM:
            load_bytes.labels(tier)
        return cls(queries, hits, load_bytes, load_seconds)

    def count(self, num_prompt_tokens: int, cached: dict[str, int]) -> None:
        """One prompt, and its cached tokens by tier (`timing.cached_by_tier`)."""
        self.queries.inc(num_prompt_tokens)
        for tier, tokens in cached.items():
            if tokens:
                self.hits.labels(tier).inc(tokens)

    def loaded(self, tier: str, nbytes: int, seconds: float) -> None:
        """One prefix fetched whole from `tier` ("kvstore" or "peer"): its bytes and time."""
        if nbytes and seconds > 0:
            self.load_bytes.labels(tier).inc(nbytes)
            self.load_seconds.labels(tier).observe(seconds)
