"""A run's result as one JSON document: vLLM's top-level keys (what `vllm bench serve
--save-result` writes, so tools that read those files read ours), vLLM's per-request
arrays, and kvstack's per-request records. `loadgen run`, `loadgen sim` and
`loadgen report` all read and write this one shape."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import orjson

from loadgen.records import RequestRecord
from shared.errors import KvstackError


def build_result(summary: dict, records: Sequence[RequestRecord], meta: dict) -> dict:
    """`meta`: how the run was made (backend, model_id, dataset, request_rate, burstiness,
    max_concurrency, label, ...); `summary`: `metrics.summarize`'s numbers."""
    return {
        "date": datetime.now(UTC).strftime("%Y%m%d-%H%M%S"),
        **meta,
        **summary,
        **vllm_arrays(records),
        "records": [r.to_json() for r in records],
    }


def vllm_arrays(records: Sequence[RequestRecord]) -> dict:
    """The per-request lists `vllm bench serve --save-detailed` writes."""
    return {
        "input_lens": [r.input_len for r in records],
        "output_lens": [r.output_len for r in records],
        "ttfts": [r.ttft or 0.0 for r in records],
        "itls": [list(r.itl) for r in records],
        "start_times": [r.start_time for r in records],
        "latencies": [r.latency for r in records],
        "errors": [r.error for r in records],
    }


def save_result(result: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    return path


def load_result(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise KvstackError(f"result file not found: {path}")
    try:
        result = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as e:
        raise KvstackError(f"{path}: not a JSON result ({e})") from None
    if not isinstance(result, dict) or "records" not in result:
        raise KvstackError(f"{path}: not a loadgen result (no 'records')")
    return result


def records_of(result: dict) -> list[RequestRecord]:
    return [RequestRecord.from_json(r) for r in result["records"]]
