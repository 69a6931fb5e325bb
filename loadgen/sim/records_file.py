"""A simulation's per-request records as columns (`loadgen sim --records PATH`): one numpy
array per field in a compressed .npz, a row per request in trace order. The result JSON
keeps only the run's numbers; this file is for what needs every request (the conductor's
prediction errors, where requests ran, latency distributions).

Columns (seconds unless named otherwise; NaN where a request has no such time, -1 where
it has no such node):

    arrival, ttft, e2e, prompt_tokens, output_tokens, cached_tokens, status, wasted,
    prefill, decode, fetched_from (indices into node_names), total_blocks, local_blocks,
    fetched_blocks, queue_s, fetch_s, compute_s, predicted_ttft, mooncake_tbt

With `--records-itl` also every gap between tokens: `itl` (float32, all requests' gaps
one after another) and `itl_offsets` (request i's gaps are itl[itl_offsets[i]:
itl_offsets[i + 1]]); `request_gaps` slices them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from loadgen.records import RequestRecord
from loadgen.sim.report import mooncake_tbt
from shared.errors import KvstackError

NO_NODE = -1
FLOAT_FACTS = ("queue_s", "fetch_s", "compute_s", "predicted_ttft")
BLOCK_FACTS = ("total_blocks", "local_blocks", "fetched_blocks")
# the record's extra key behind each column that is not named the same
EXTRA_KEYS = {"queue_s": "prefill_queue_s"}


def record_columns(records: Sequence[RequestRecord], with_itl: bool = False) -> dict:
    """The columns of `records` (see the module's docstring)."""
    columns = {
        "arrival": np.array([r.start_time for r in records], dtype=np.float64),
        "ttft": np.array([nan_if_none(r.ttft) for r in records], dtype=np.float64),
        "e2e": np.array([r.latency if r.success else np.nan for r in records]),
        "prompt_tokens": np.array([r.input_len for r in records], dtype=np.int32),
        "output_tokens": np.array([r.output_len for r in records], dtype=np.int32),
        "cached_tokens": np.array([r.cached_tokens for r in records], dtype=np.int32),
        "status": np.array([r.status for r in records], dtype=np.int16),
        "wasted": np.array([bool(r.extra.get("wasted_prefill")) for r in records]),
        "mooncake_tbt": np.array([mooncake_tbt(r.itl) if r.success else np.nan for r in records]),
        **node_columns(records),
        **fact_columns(records),
    }
    if with_itl:
        columns.update(gap_columns(records))
    return columns


def nan_if_none(value: float | None) -> float:
    return np.nan if value is None else value


def node_columns(records: Sequence[RequestRecord]) -> dict:
    """prefill, decode and fetched_from as indices into node_names (sorted names)."""
    keys = {"prefill": "prefill", "decode": "decode", "fetched_from": "fetched_from"}
    names = sorted({r.extra[k] for r in records for k in keys.values() if r.extra.get(k)})
    index = {name: i for i, name in enumerate(names)}
    columns = {
        column: np.array([index.get(r.extra.get(key) or "", NO_NODE) for r in records], np.int16)
        for column, key in keys.items()
    }
    return {"node_names": np.array(names, dtype=str), **columns}


def fact_columns(records: Sequence[RequestRecord]) -> dict:
    """What the simulator noted of each request's prefill (the records' `extra`)."""
    columns = {}
    for column in FLOAT_FACTS:
        key = EXTRA_KEYS.get(column, column)
        columns[column] = np.array([r.extra.get(key, np.nan) for r in records], np.float64)
    for column in BLOCK_FACTS:
        columns[column] = np.array([r.extra.get(column, 0) for r in records], np.int32)
    return columns


def gap_columns(records: Sequence[RequestRecord]) -> dict:
    lengths = np.array([len(r.itl) for r in records], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    flat = np.fromiter((gap for r in records for gap in r.itl), np.float32, int(offsets[-1]))
    return {"itl": flat, "itl_offsets": offsets}


def save_records(path: str | Path, records: Sequence[RequestRecord], with_itl: bool) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:  # a file object: np.savez would add ".npz" to another suffix
        np.savez_compressed(f, **record_columns(records, with_itl))
    return path


def load_records(path: str | Path) -> dict[str, np.ndarray]:
    """The columns `save_records` wrote, by name."""
    path = Path(path)
    if not path.is_file():
        raise KvstackError(f"records file not found: {path}")
    with np.load(path, allow_pickle=False) as data:
        return {name: data[name] for name in data.files}


def request_gaps(columns: dict[str, np.ndarray], i: int) -> np.ndarray:
    """Request i's gaps between tokens (seconds), from a file written with the gaps."""
    if "itl" not in columns:
        raise KvstackError("these records were written without token gaps (--records-itl)")
    offsets = columns["itl_offsets"]
    return columns["itl"][offsets[i] : offsets[i + 1]]
