"""Thread-safe byte and frame totals shared by a sender's or receiver's I/O threads."""

from __future__ import annotations

import threading


class Counters:
    """Totals that several I/O threads add to."""

    def __init__(self, *names: str) -> None:
        self._lock = threading.Lock()
        self._values = dict.fromkeys(names, 0)

    def add(self, **amounts: int) -> None:
        with self._lock:
            for name, amount in amounts.items():
                self._values[name] += amount

    def __getitem__(self, name: str) -> int:
        return self._values[name]
