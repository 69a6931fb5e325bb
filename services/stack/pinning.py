"""A model process's cores and torch threads (`--cores`, `--threads`), applied before any
of its threads starts computing.

NOTE: Linux keeps CPU affinity per thread, and a new thread inherits its creator's; so
every thread alive now is pinned (a library may have started one at import), and the
engine thread and torch's intra-op threads, started later, inherit the set. The asyncio
thread shares the set: it mostly waits, and a thread fewer for torch costs more than its
short turns take.
"""

from __future__ import annotations

import os

from shared.cpu_cores import format_cores, parse_cores
from shared.errors import KvstackError


def usable_cores() -> tuple[int, ...]:
    """The cores this process may run on (its affinity: a cgroup or taskset narrows it)."""
    return tuple(sorted(os.sched_getaffinity(0)))


def chosen_cores(cores_text: str) -> tuple[int, ...]:
    """The cores `--cores` names (none: all this process may use), each one it may use."""
    allowed = usable_cores()
    cores = parse_cores(cores_text) if cores_text else allowed
    outside = sorted(set(cores) - set(allowed))
    if outside:
        raise KvstackError(
            f"--cores {cores_text}: this process may not run on {format_cores(outside)} "
            f"(it may use {format_cores(allowed)})"
        )
    return cores


def pin(cores_text: str, threads: int | None) -> int:
    """Pin this process to `--cores` (none: keep the cores it may use) and return its
    torch threads: `--threads`, else one per core."""
    cores = chosen_cores(cores_text)
    if threads is not None and threads < 1:
        raise KvstackError(f"--threads must be at least 1, got {threads}")
    if cores_text:
        _set_affinity(cores)
    return threads or max(1, len(cores))


def _set_affinity(cores: tuple[int, ...]) -> None:
    for task in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(task), cores)
        except ProcessLookupError:  # that thread ended meanwhile
            pass
