"""Which CPU cores each model process of one machine computes on: a plan made once from
the cores this process may use (`os.sched_getaffinity`), so that the workers' compute
threads never outnumber the cores. Pure: `services/stack/pinning.py` applies a plan.

- At least as many cores as workers: each worker gets a contiguous run of cores of its
  own, the runs as even as possible (the first ones one core more), and as many torch
  threads as it has cores.
- Fewer cores than workers: each worker gets one core (one thread), dealt round-robin,
  so no core holds more than ceil(workers / cores) of them, the fewest one can.
"""

from __future__ import annotations

from collections.abc import Sequence

from shared.errors import KvstackError


def plan_cores(cores: Sequence[int], workers: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """Each worker's cores, by name; its torch threads are as many as its cores."""
    if not cores:
        raise KvstackError("no CPU core to place workers on")
    if len(set(workers)) != len(workers):
        raise KvstackError(f"worker names must be unique: {list(workers)}")
    ordered = sorted(set(cores))
    if len(workers) > len(ordered):
        return {w: (ordered[i % len(ordered)],) for i, w in enumerate(workers)}
    share, extra = divmod(len(ordered), len(workers))
    plan, start = {}, 0
    for i, worker in enumerate(workers):
        size = share + (1 if i < extra else 0)
        plan[worker] = tuple(ordered[start : start + size])
        start += size
    return plan


def parse_cores(text: str) -> tuple[int, ...]:
    """`0-3,8` as (0, 1, 2, 3, 8): the list form of taskset and cpusets."""
    cores: set[int] = set()
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        try:
            low, high = int(first), int(last if dash else first)
        except ValueError:
            raise KvstackError(f"--cores {text!r}: give cores as e.g. 0-3,8") from None
        if low < 0 or high < low:
            raise KvstackError(f"--cores {text!r}: {part.strip()!r} is not a range of cores")
        cores.update(range(low, high + 1))
    return tuple(sorted(cores))


def format_cores(cores: Sequence[int]) -> str:
    """The shortest `parse_cores` text of `cores`: (0, 1, 2, 3, 8) as `0-3,8`."""
    ordered = sorted(set(cores))
    runs: list[list[int]] = []
    for core in ordered:
        if runs and core == runs[-1][-1] + 1:
            runs[-1].append(core)
        else:
            runs.append([core])
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)
