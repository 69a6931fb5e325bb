"""A run's result as one JSON document: vLLM's top-level keys (what `vllm bench serve
--save-result` writes, so tools that read those files read ours), vLLM's per-request
arrays, and kvstack's per-request records. `loadgen run` writes this shape and
`loadgen report` reads it. `loadgen sim` writes the same document without the per-request
parts (`result_header` and its "sim" section): a simulation replays thousands of
requests, and their token gaps would make the file hundreds of MB (its records go to a
columnar file on request, `loadgen/sim/records_file.py`)."""

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
        **result_header(summary, meta),
        **vllm_arrays(records),
        "records": [r.to_json() for r in records],
    }


def result_header(summary: dict, meta: dict) -> dict:
    """The document's run-level part: the date, `meta` and `summary`, no per-request data."""
    return {"date": datetime.now(UTC).strftime("%Y%m%d-%H%M%S"), **meta, **summary}


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
    if not isinstance(result, dict) or not ({"records", "num_prompts"} & result.keys()):
        raise KvstackError(f"{path}: not a loadgen result (no 'records', no 'num_prompts')")
    return result


def has_records(result: dict) -> bool:
    return "records" in result


def records_of(result: dict) -> list[RequestRecord]:
    if not has_records(result):
        raise KvstackError(
            f"{result.get('label') or 'the result'} has no per-request records "
            "(`loadgen sim` writes them only with --records, to a file of their own)"
        )
    return [RequestRecord.from_json(r) for r in result["records"]]
