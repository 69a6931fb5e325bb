"""Stop strings over streamed text."""

from __future__ import annotations


class StopStringMatcher:
    """Finds the first stop string in a growing text and truncates before it.

    Text that could still turn out to be the start of a stop string is held back,
    so a streamed reply never shows part of a stop string.
    """

    def __init__(self, stop: tuple[str, ...]) -> None:
        self.stop = stop
        self.holdback = max((len(s) for s in stop), default=1) - 1
        self.text = ""
        self.num_emitted = 0
        self.matched: str | None = None

    def feed(self, delta: str, matching: bool = True) -> str:
        """Add `delta`; return the text that is now safe to emit. Without `matching` the
        text is only kept (a stop string that ends in it is not looked for again)."""
        search_from = max(0, len(self.text) - self.holdback)
        self.text += delta
        hit = self._first_hit(search_from) if matching else None
        if hit is not None:
            self.matched, self.text = hit[1], self.text[: hit[0]]
            return self._emit(len(self.text))
        return self._emit(len(self.text) - self.holdback)

    def flush(self) -> str:
        return self._emit(len(self.text))

    def _first_hit(self, search_from: int) -> tuple[int, str] | None:
        hits = [(self.text.find(s, search_from), s) for s in self.stop]
        hits = [(index, s) for index, s in hits if index >= 0]
        return min(hits) if hits else None

    def _emit(self, end: int) -> str:
        if end <= self.num_emitted:
            return ""
        out = self.text[self.num_emitted : end]
        self.num_emitted = end
        return out
