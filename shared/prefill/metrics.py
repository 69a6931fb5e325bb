"""A prefill worker's prefix-cache counters, in prompt tokens as vLLM's
(`prefix_cache_queries_total`, `prefix_cache_hits_total`), with the tier each hit came
from: its own cache ("local"), the kvstore pool ("kvstore"), or a peer prefill worker
("peer"). Counted once a prompt's KV went out whole, so a failed load counts nothing."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import Counter

from shared.metrics import Metrics

TIERS = ("local", "kvstore", "peer")


@dataclass(frozen=True)
class PrefixCounters:
    queries: Counter
    hits: Counter

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
        return cls(queries, hits)

    def count(self, num_prompt_tokens: int, cached: dict[str, int]) -> None:
        """One prompt, and its cached tokens by tier (`timing.cached_by_tier`)."""
        self.queries.inc(num_prompt_tokens)
        for tier, tokens in cached.items():
            if tokens:
                self.hits.labels(tier).inc(tokens)
