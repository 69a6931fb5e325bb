"""A prefill worker's prefix-cache counters, in prompt tokens as vLLM's
(`prefix_cache_queries_total`, `prefix_cache_hits_total`), with the tier each hit came
from: its own cache ("local"), the kvstore pool ("kvstore"), or a peer prefill worker
("peer"). Counted once a prompt's KV went out whole, so a failed load counts nothing."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import Counter

from shared.metrics import Metrics
from shared.prefill.prefix import PrefixPlan
from shared.prefill.timing import cached_by_tier

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

    def count(
        self,
        num_prompt_tokens: int,
        num_cached_tokens: int,
        plan: PrefixPlan | None,
        block_size: int,
    ) -> None:
        """One prompt: `num_cached_tokens` needed no compute; `plan` says which of them
        were fetched, and from where (the rest were in the local cache)."""
        self.queries.inc(num_prompt_tokens)
        for tier, tokens in cached_by_tier(num_cached_tokens, plan, block_size).items():
            if tokens:
                self.hits.labels(tier).inc(tokens)
