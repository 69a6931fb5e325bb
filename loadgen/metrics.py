"""Serving metrics with vLLM's names and formulas (`vllm bench serve`):

- TTFT: time to the first event with a non-empty `choices`.
- TPOT: (E2EL - TTFT) / (output tokens - 1), per request, requests with > 1 token.
- ITL: gaps between successive token events, pooled over all requests.
- E2EL: time to the last token event.
- goodput: requests meeting every SLO given (`ttft:MS tpot:MS e2el:MS`) per second.
- SLO attainment: those good requests / all requests sent (rejected and failed count as
  missing the SLO; the Mooncake papers' "effective request capacity").
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np

from loadgen.records import RequestRecord
from shared.errors import KvstackError

GOODPUT_KEYS = ("ttft", "tpot", "e2el")
DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)


def parse_goodput(items: Sequence[str]) -> dict[str, float]:
    """`["ttft:500", "tpot:50"]` -> {"ttft": 0.5, "tpot": 0.05} (milliseconds in, seconds out)."""
    slos: dict[str, float] = {}
    for item in items:
        key, _, value = item.partition(":")
        if key not in GOODPUT_KEYS or not _is_positive(value):
            raise KvstackError(
                f"bad --goodput item {item!r}: expected KEY:MS with KEY one of "
                f"{', '.join(GOODPUT_KEYS)} and MS a positive number"
            )
        slos[key] = float(value) / 1000.0
    return slos


def _is_positive(text: str) -> bool:
    try:
        value = float(text)
    except ValueError:
        return False
    return value > 0 and math.isfinite(value)


def is_good(record: RequestRecord, slos: dict[str, float]) -> bool:
    ttft = record.ttft
    if not record.success or ttft is None:  # success means a first token came
        return False
    values = {"ttft": ttft, "tpot": record.tpot, "e2el": record.latency}
    return all(values[key] <= limit for key, limit in slos.items())


def summarize(
    records: Sequence[RequestRecord],
    duration: float,
    slos: dict[str, float] | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
) -> dict:
    """The run's numbers under vLLM's JSON keys, plus kvstack's (rejections, attainment)."""
    done = [r for r in records if r.success]
    duration = max(duration, 1e-9)
    output_tokens = sum(r.output_len for r in done)
    input_tokens = sum(r.input_len for r in done)
    good = sum(is_good(r, slos) for r in records) if slos else None
    summary = {
        "duration": duration,
        "num_prompts": len(records),
        "completed": len(done),
        "failed": len(records) - len(done),
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": len(done) / duration,
        "request_goodput": None if good is None else good / duration,
        "output_throughput": output_tokens / duration,
        "total_token_throughput": (input_tokens + output_tokens) / duration,
        "max_output_tokens_per_s": peak_tokens_per_second(done),
        "max_concurrent_requests": max_concurrency(done),
        "rejected": sum(r.rejected for r in records),
        "errors_by_status": errors_by_status(records),
        "slo": {key: value * 1000 for key, value in (slos or {}).items()},
        "slo_attainment": None if good is None else good / max(len(records), 1),
        "cached_tokens": sum(r.cached_tokens for r in done),
    }
    for name, values in metric_values(done).items():
        summary.update(describe(name, values, percentiles))
    return summary


def metric_values(done: Sequence[RequestRecord]) -> dict[str, list[float]]:
    return {
        "ttft": [r.ttft for r in done if r.ttft is not None],  # all of them: done succeeded
        "tpot": [r.tpot for r in done if r.output_len > 1],
        "itl": [gap for r in done for gap in r.itl],
        "e2el": [r.latency for r in done],
    }


def describe(name: str, values: Sequence[float], percentiles: Sequence[float]) -> dict:
    """mean/median/std/pNN of one metric in milliseconds, named as vLLM names them."""
    ms = np.asarray(values, dtype=float) * 1000.0 if len(values) else np.zeros(1)
    out = {
        f"mean_{name}_ms": float(ms.mean()),
        f"median_{name}_ms": float(np.median(ms)),
        f"std_{name}_ms": float(ms.std()),
    }
    for p in percentiles:
        out[f"p{_percentile_label(p)}_{name}_ms"] = float(np.percentile(ms, p))
    return out


def _percentile_label(p: float) -> str:
    return str(int(p)) if float(p).is_integer() else str(p)


def peak_tokens_per_second(done: Sequence[RequestRecord]) -> float:
    """The most token events that arrived within one 1-second bucket of the run."""
    buckets = Counter(int(t) for r in done for t in r.token_times())
    return float(max(buckets.values(), default=0))


def max_concurrency(done: Sequence[RequestRecord]) -> int:
    """Peak number of requests in flight at once (sweep over start/end events)."""
    events = sorted(
        [(r.start_time, 1) for r in done] + [(r.start_time + r.latency, -1) for r in done],
        key=lambda e: (e[0], e[1]),
    )
    peak = level = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


def errors_by_status(records: Sequence[RequestRecord]) -> dict[str, int]:
    return dict(Counter(str(r.status) for r in records if not r.success))
