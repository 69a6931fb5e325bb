"""`loadgen trace import`: public traces without prefix information, as Mooncake traces.

They say when each request came and how long its prompt and answer were, not what the
prompt held, so every block gets a fresh id: reuse 0, the floor any cache starts from.
- BurstGPT (`Timestamp` in seconds, `Model`, `Request tokens`, `Response tokens`, ...);
- Azure LLM inference traces 2023/2024 (`TIMESTAMP` like `2023-11-16 18:15:46.6805900`,
  `ContextTokens`, `GeneratedTokens`).
Rows with no prompt or no answer (failed requests) are skipped and counted."""

from __future__ import annotations

import csv
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from loadgen.trace import TRACE_BLOCK_SIZE, TraceRow
from shared.errors import KvstackError


@dataclass(frozen=True)
class CsvFormat:
    time: str
    input: str
    output: str
    parse_time: Callable[[str], float]  # seconds, from any fixed origin


@dataclass(frozen=True)
class Imported:
    rows: list[TraceRow]
    skipped: int  # rows with zero prompt or answer tokens


@dataclass(frozen=True)
class Request:
    time: float
    input_length: int
    output_length: int


def azure_time(text: str) -> float:
    """Seconds since the epoch of `2023-11-16 18:15:46.6805900` (UTC; Python's parser
    takes at most six fractional digits, the traces have seven)."""
    whole, _, fraction = text.strip().partition(".")
    moment = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
    return moment.timestamp() + (float(f"0.{fraction}") if fraction else 0.0)


FORMATS = {
    "burstgpt": CsvFormat("Timestamp", "Request tokens", "Response tokens", float),
    "azure": CsvFormat("TIMESTAMP", "ContextTokens", "GeneratedTokens", azure_time),
}
MODEL_COLUMN = "Model"  # BurstGPT's


def import_csv(
    path: str | Path, format_name: str, model: str | None = None, max_requests: int | None = None
) -> Imported:
    """The CSV's requests in arrival order, from time 0, each block with a fresh id."""
    fmt = FORMATS[format_name]
    requests, skipped = read_requests(Path(path), fmt, model, max_requests)
    if not requests:
        raise KvstackError(f"{path}: no request with both prompt and answer tokens")
    requests.sort(key=lambda r: r.time)
    return Imported(fresh_rows(requests), skipped)


def read_requests(
    path: Path, fmt: CsvFormat, model: str | None, max_requests: int | None
) -> tuple[list[Request], int]:
    if not path.is_file():
        raise KvstackError(f"CSV file not found: {path}")
    requests: list[Request] = []
    skipped = 0
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        check_columns(path, reader.fieldnames or [], fmt, model)
        for line, record in enumerate(reader, 2):
            if model is not None and record[MODEL_COLUMN] != model:
                continue
            request = parse_request(record, fmt, f"{path}:{line}")
            if request.input_length <= 0 or request.output_length <= 0:
                skipped += 1
            else:
                requests.append(request)
            if len(requests) == max_requests:
                break
    return requests, skipped


def check_columns(path: Path, columns: Sequence[str], fmt: CsvFormat, model: str | None) -> None:
    wanted = [fmt.time, fmt.input, fmt.output] + ([MODEL_COLUMN] if model is not None else [])
    missing = [name for name in wanted if name not in columns]
    if missing:
        raise KvstackError(
            f"{path}: missing column(s) {', '.join(map(repr, missing))}; "
            f"the header has {', '.join(map(repr, columns)) or 'nothing'}"
        )


def parse_request(record: dict[str, str], fmt: CsvFormat, where: str) -> Request:
    return Request(
        _parse(fmt.parse_time, record, fmt.time, where),
        int(_parse(tokens, record, fmt.input, where)),
        int(_parse(tokens, record, fmt.output, where)),
    )


def tokens(text: str) -> float:
    return int(float(text))


def _parse(parse: Callable[[str], float], record: dict[str, str], column: str, where: str) -> float:
    text = record.get(column) or ""
    try:
        return parse(text)
    except (ValueError, OverflowError):
        raise KvstackError(f"{where}: {column!r} cannot be read: {text!r}") from None


def fresh_rows(requests: list[Request]) -> list[TraceRow]:
    fresh = itertools.count()
    first = requests[0].time
    return [
        TraceRow(
            r.time - first,
            r.input_length,
            r.output_length,
            tuple(itertools.islice(fresh, -(-r.input_length // TRACE_BLOCK_SIZE))),
        )
        for r in requests
    ]
