"""A progress line on stderr: completed/total, failures, elapsed time, completion rate.

On a terminal the line is redrawn in place at most every `interval` seconds; elsewhere (CI
logs, pipes) a new line is printed at most every `log_interval` seconds."""

from __future__ import annotations

import sys
import time
from typing import TextIO

BAR_WIDTH = 24


class Progress:
    def __init__(
        self,
        total: int,
        stream: TextIO | None = None,
        interval: float = 0.1,
        log_interval: float = 5.0,
    ) -> None:
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.live = self.stream.isatty()
        self.interval = interval if self.live else log_interval
        self.started = time.monotonic()
        self.done = self.failed = 0
        self._drawn_at = float("-inf")

    def update(self, success: bool) -> None:
        self.done += 1
        self.failed += not success
        now = time.monotonic()
        if now - self._drawn_at >= self.interval:
            self._draw(now)

    def close(self, note: str = "") -> None:
        self._draw(time.monotonic(), note)
        if self.live:
            self.stream.write("\n")
        self.stream.flush()

    def line(self, now: float) -> str:
        elapsed = now - self.started
        filled = BAR_WIDTH * self.done // max(self.total, 1)
        bar = "#" * filled + "." * (BAR_WIDTH - filled)
        rate = self.done / elapsed if elapsed > 0 else 0.0
        return (
            f"[{bar}] {self.done}/{self.total} done, {self.failed} failed, "
            f"{elapsed:.1f}s, {rate:.2f} req/s"
        )

    def _draw(self, now: float, note: str = "") -> None:
        self._drawn_at = now
        text = self.line(now) + (f" ({note})" if note else "")
        self.stream.write(f"\r{text}\x1b[K" if self.live else text + "\n")
        self.stream.flush()
