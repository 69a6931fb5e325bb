"""Mooncake traces: JSONL rows of `timestamp` (ms), `input_length`, `output_length` and
`hash_ids` (prefix-chained ids of 512-token blocks; an equal id means an equal block and
an equal prefix). `loadgen run` turns them into prompts, `loadgen sim` replays them as
they are; both read them here. `loadgen trace gen` and `trace import` write them here."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import orjson

from shared.errors import KvstackError

TRACE_BLOCK_SIZE = 512


@dataclass(frozen=True)
class TraceRow:
    timestamp: float  # seconds after the trace's first request
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def load_trace(
    path: str | Path,
    max_requests: int | None = None,
    duration: float | None = None,
    time_scale: float = 1.0,
) -> list[TraceRow]:
    """Rows in arrival order, timestamps in seconds from the first one and multiplied by
    `time_scale` (2.0 replays at half speed), cut to `max_requests` and to arrivals
    before `duration` seconds (after scaling)."""
    if time_scale <= 0:
        raise KvstackError(f"time scale must be positive, got {time_scale}")
    rows = sorted(_read(Path(path)), key=lambda row: row.timestamp)
    if not rows:
        raise KvstackError(f"{path}: the trace has no requests")
    first = rows[0].timestamp
    rows = [
        TraceRow(
            (row.timestamp - first) * time_scale, row.input_length, row.output_length, row.hash_ids
        )
        for row in rows
    ]
    if duration is not None:
        rows = [row for row in rows if row.timestamp < duration]
    return rows[:max_requests] if max_requests is not None else rows


def write_trace(path: str | Path, rows: Iterable[TraceRow]) -> int:
    """Rows as JSONL in Mooncake's key order, timestamps in whole milliseconds; returns the
    number written. The same rows always give the same bytes."""
    count = 0
    with Path(path).open("wb") as f:
        for row in rows:
            f.write(format_row(row))
            count += 1
    return count


def format_row(row: TraceRow) -> bytes:
    return orjson.dumps(
        {
            "timestamp": round(row.timestamp * 1000),
            "input_length": row.input_length,
            "output_length": row.output_length,
            "hash_ids": list(row.hash_ids),
        },
        option=orjson.OPT_APPEND_NEWLINE,
    )


def _read(path: Path) -> Iterable[TraceRow]:
    if not path.is_file():
        raise KvstackError(f"trace file not found: {path}")
    with path.open("rb") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                yield parse_row(line, f"{path}:{number}")


def parse_row(line: bytes | str, where: str) -> TraceRow:
    try:
        data = orjson.loads(line)
    except orjson.JSONDecodeError as e:
        raise KvstackError(f"{where}: not JSON ({e})") from None
    if not isinstance(data, dict):
        raise KvstackError(f"{where}: expected an object, got {type(data).__name__}")
    row = TraceRow(
        _number(data, "timestamp", where) / 1000.0,
        int(_number(data, "input_length", where, positive=True)),
        int(_number(data, "output_length", where, positive=True)),
        _hash_ids(data, where),
    )
    _check_blocks(row, where)
    return row


def _number(data: dict, key: str, where: str, positive: bool = False) -> float:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise KvstackError(f"{where}: {key!r} must be a number, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise KvstackError(
            f"{where}: {key!r} must be {'positive' if positive else '>= 0'}, got {value}"
        )
    return value


def _hash_ids(data: dict, where: str) -> tuple[int, ...]:
    ids = data.get("hash_ids", [])
    if not isinstance(ids, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids
    ):
        raise KvstackError(f"{where}: 'hash_ids' must be a list of non-negative integers")
    return tuple(ids)


def _check_blocks(row: TraceRow, where: str) -> None:
    """Rows that carry hash ids must carry one per 512-token block, the last one partial."""
    expected = math.ceil(row.input_length / TRACE_BLOCK_SIZE)
    if row.hash_ids and len(row.hash_ids) != expected:
        raise KvstackError(
            f"{where}: {len(row.hash_ids)} hash_ids for input_length "
            f"{row.input_length}; expected {expected} "
            f"(one per {TRACE_BLOCK_SIZE}-token block)"
        )
