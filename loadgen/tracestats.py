"""`loadgen trace stats`: what a Mooncake trace asks of a cluster, to match a generated
trace to a real one: arrival rate and burstiness, lengths, the reuse any cache could get,
and the sessions and shared prefixes the hash ids reveal.

Sessions are inferred from the prefix chains. A request continues an earlier one when its
leading ids are exactly the earlier one's full blocks and its prompt is at least the
earlier prompt and answer long (a chat turn resends both: this keeps apart two questions
on the same document); a request is continued at most once (a second match is a branch,
counted as a new session). A request whose first block appeared before shares a prefix
with an earlier one."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from loadgen.trace import TRACE_BLOCK_SIZE, TraceRow

TOP_FIRST_BLOCKS = 5


@dataclass(frozen=True)
class Lengths:
    mean: float
    p50: float
    p90: float
    p99: float
    max: int


@dataclass(frozen=True)
class Sessions:
    sessions: int  # single requests included
    multi_turn: int  # sessions of two turns or more
    multi_turn_share: float  # share of requests in a multi-turn session
    turns_mean: float  # over multi-turn sessions
    turns_max: int


@dataclass(frozen=True)
class Prefixes:
    shared_share: float  # requests whose first block appeared in an earlier request
    distinct_first_blocks: int
    top_first_blocks: tuple[float, ...]  # share of requests that start with each of the top 5


@dataclass(frozen=True)
class TraceStats:
    requests: int
    duration: float  # seconds from the first arrival to the last
    rate: float | None  # requests / duration
    interarrival_cv: float | None  # std / mean of the gaps between arrivals
    burstiness: float | None  # 1 / cv²: the gamma shape with that spread (1 = Poisson)
    input: Lengths
    output: Lengths
    reuse_ceiling: float  # blocks seen before / all blocks: an infinite cache's hit ratio
    reusable_token_share: float  # the same, weighted by the tokens in each block
    prefixes: Prefixes
    sessions: Sessions


def trace_stats(rows: Sequence[TraceRow]) -> TraceStats:
    """Statistics of `rows` in arrival order (as `load_trace` returns them)."""
    times = np.asarray([row.timestamp for row in rows])
    duration = float(times[-1] - times[0]) if rows else 0.0
    cv = gap_cv(times)
    return TraceStats(
        requests=len(rows),
        duration=duration,
        rate=len(rows) / duration if duration > 0 else None,
        interarrival_cv=cv,
        burstiness=1 / cv**2 if cv else None,
        input=lengths([row.input_length for row in rows]),
        output=lengths([row.output_length for row in rows]),
        reuse_ceiling=infinite_cache_hit_ratio(rows),
        reusable_token_share=reusable_token_share(rows),
        prefixes=prefix_stats(rows),
        sessions=session_stats(rows),
    )


def gap_cv(times: np.ndarray) -> float | None:
    gaps = np.diff(times)
    if len(gaps) < 2 or gaps.mean() == 0:
        return None
    return float(gaps.std() / gaps.mean())


def lengths(values: Sequence[int]) -> Lengths:
    if not values:
        return Lengths(0.0, 0.0, 0.0, 0.0, 0)
    p50, p90, p99 = (float(p) for p in np.percentile(values, [50, 90, 99]))
    return Lengths(float(np.mean(values)), p50, p90, p99, int(max(values)))


def infinite_cache_hit_ratio(rows: Sequence[TraceRow]) -> float:
    """Blocks seen before (in arrival order) over all blocks: the hit ratio of a cache that
    never evicts, the ceiling of any other (the simulator reports it beside its hit
    ratios)."""
    seen: set[int] = set()
    repeated = total = 0
    for row in rows:
        for block_hash in row.hash_ids:
            repeated += block_hash in seen
            seen.add(block_hash)
        total += len(row.hash_ids)
    return repeated / total if total else 0.0


def reusable_token_share(rows: Sequence[TraceRow]) -> float:
    """Input tokens in blocks seen before over all input tokens of rows with ids."""
    seen: set[int] = set()
    reusable = total = 0
    for row in rows:
        for position, block_hash in enumerate(row.hash_ids):
            if block_hash in seen:
                reusable += min(TRACE_BLOCK_SIZE, row.input_length - position * TRACE_BLOCK_SIZE)
            seen.add(block_hash)
        total += row.input_length if row.hash_ids else 0
    return reusable / total if total else 0.0


def prefix_stats(rows: Sequence[TraceRow]) -> Prefixes:
    firsts = [row.hash_ids[0] for row in rows if row.hash_ids]
    counts = Counter(firsts)
    top = sorted(counts.values(), reverse=True)[:TOP_FIRST_BLOCKS]
    return Prefixes(
        shared_share=(len(firsts) - len(counts)) / len(rows) if rows else 0.0,
        distinct_first_blocks=len(counts),
        top_first_blocks=tuple(count / len(rows) for count in top),
    )


def session_stats(rows: Sequence[TraceRow]) -> Sessions:
    turns = sorted(Counter(session_of(rows)).values())
    multi = [count for count in turns if count > 1]
    return Sessions(
        sessions=len(turns),
        multi_turn=len(multi),
        multi_turn_share=sum(multi) / len(rows) if rows else 0.0,
        turns_mean=float(np.mean(multi)) if multi else 0.0,
        turns_max=max(turns, default=0),
    )


def session_of(rows: Sequence[TraceRow]) -> list[int]:
    """Each request's session, named by the index of its first request."""
    ends: dict[int, int] = {}  # last id of a request's full blocks -> that request
    sessions: list[int] = []
    for index, row in enumerate(rows):
        parent = continued_request(rows, row, ends)
        sessions.append(sessions[parent] if parent is not None else index)
        full = row.hash_ids[: row.input_length // TRACE_BLOCK_SIZE]
        if full:
            ends[full[-1]] = index
    return sessions


def continued_request(rows: Sequence[TraceRow], row: TraceRow, ends: dict[int, int]) -> int | None:
    """The request whose full blocks are the longest leading run of `row`'s ids that `row`
    holds with its answer; an id names its whole prefix, so one lookup per position
    suffices. The request found is removed from `ends`: it is continued only once."""
    for block_hash in reversed(row.hash_ids):
        earlier = ends.get(block_hash)
        if earlier is not None and row.input_length >= _turn_length(rows[earlier]):
            return ends.pop(block_hash)
    return None


def _turn_length(row: TraceRow) -> int:
    return row.input_length + row.output_length


def format_stats(stats: TraceStats) -> str:
    prefixes, sessions = stats.prefixes, stats.sessions
    cv, burstiness = _number(stats.interarrival_cv, ".3f"), _number(stats.burstiness, ".2f")
    top = " ".join(f"{share:.3f}" for share in prefixes.top_first_blocks)
    lines = [
        ("requests", str(stats.requests)),
        ("duration (s)", f"{stats.duration:.1f}"),
        ("rate (req/s)", _number(stats.rate, ".3f")),
        ("inter-arrival CV", f"{cv}  (burstiness 1/CV² {burstiness})"),
        ("", "    mean      p50      p90      p99      max"),
        ("input tokens", _lengths(stats.input)),
        ("output tokens", _lengths(stats.output)),
        ("reuse ceiling", f"{stats.reuse_ceiling:.3f}  (infinite-cache block hit ratio)"),
        ("reusable tokens", f"{stats.reusable_token_share:.3f}"),
        ("shared first block", f"{prefixes.shared_share:.3f} of requests"),
        ("distinct first blocks", str(prefixes.distinct_first_blocks)),
        ("top first blocks", f"{top}  (share of requests)"),
        ("sessions", f"{sessions.sessions}, {sessions.multi_turn} multi-turn"),
        ("in multi-turn", f"{sessions.multi_turn_share:.3f} of requests"),
        ("turns (multi-turn)", f"mean {sessions.turns_mean:.2f}, max {sessions.turns_max}"),
    ]
    return "\n".join(f"{label:<22}{value}" for label, value in lines)


def _lengths(values: Lengths) -> str:
    numbers = (values.mean, values.p50, values.p90, values.p99, values.max)
    return "".join(f"{n:>8.0f} " for n in numbers).rstrip()


def _number(value: float | None, spec: str) -> str:
    return "-" if value is None or not math.isfinite(value) else format(value, spec)
