"""At most N generation requests in flight per API key (`--max-concurrent-per-key`)."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from services.gateway import errors


class PerKeyLimit:
    """Counts requests in flight by the credential they came with (an absent one counts
    as one more key); 0 means no limit."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight: Counter[str] = Counter()

    @contextmanager
    def hold(self, credential: str) -> Iterator[None]:
        """One slot for the duration of the block; 429 (an ApiError) when none is free."""
        if not self.limit:
            yield
            return
        # NOTE: a digest, so that the keys clients send are not kept in memory.
        key = hashlib.sha256(credential.encode("utf-8", "surrogatepass")).hexdigest()
        if self.in_flight[key] >= self.limit:
            raise errors.too_many_concurrent(self.limit)
        self.in_flight[key] += 1
        try:
            yield
        finally:
            self.in_flight[key] -= 1
            if not self.in_flight[key]:
                del self.in_flight[key]
