"""The console summary of a run: `vllm bench serve`'s "Serving Benchmark Result" block, with
each latency's formula under its heading, plus kvstack's lines (rejections, cache hits,
SLO attainment) and the first distinct errors."""

from __future__ import annotations

import re

WIDTH = 50
MAX_ERRORS_SHOWN = 3
# (key in the result, vLLM's word, heading, formula)
LATENCIES = (
    ("ttft", "TTFT", "Time to First Token", "first token event - send"),
    (
        "tpot",
        "TPOT",
        "Time per Output Token (excl. 1st token)",
        "(E2EL - TTFT) / (output tokens - 1)",
    ),
    ("itl", "ITL", "Inter-token Latency", "gap between successive token events"),
    ("e2el", "E2EL", "End-to-end Latency", "last token event - send"),
    ("client_queue_time", "queue time", "Client Queue Time", "wait for a --max-concurrency slot"),
)


def format_summary(result: dict) -> str:
    lines = [heading(" Serving Benchmark Result ", "=")]
    lines += [row(name, value) for name, value in totals(result) if value is not None]
    for key, word, title, formula in LATENCIES:
        if f"mean_{key}_ms" in result:
            lines += latency_section(result, key, word, title, formula)
    lines.append("=" * WIDTH)
    lines += error_lines(result)
    return "\n".join(lines)


def totals(result: dict) -> list[tuple[str, object]]:
    return [
        ("Successful requests:", result.get("completed")),
        ("Failed requests:", result.get("failed")),
        ("Rejected requests (429/503):", result.get("rejected")),
        ("Request rate configured (RPS):", result.get("request_rate")),
        ("Maximum request concurrency:", result.get("max_concurrency")),
        ("Benchmark duration (s):", result.get("duration")),
        ("Total input tokens:", result.get("total_input_tokens")),
        ("Cached input tokens:", result.get("cached_tokens")),
        ("Total generated tokens:", result.get("total_output_tokens")),
        ("Request throughput (req/s):", result.get("request_throughput")),
        ("Request goodput (req/s):", result.get("request_goodput")),
        ("SLO attainment (good / sent):", result.get("slo_attainment")),
        ("Output token throughput (tok/s):", result.get("output_throughput")),
        ("Peak output token throughput (tok/s):", result.get("max_output_tokens_per_s")),
        ("Peak concurrent requests:", result.get("max_concurrent_requests")),
        ("Total token throughput (tok/s):", result.get("total_token_throughput")),
    ]


def latency_section(result: dict, key: str, word: str, title: str, formula: str) -> list[str]:
    lines = [heading(title, "-"), f"  {word} = {formula}"]
    lines.append(row(f"Mean {word} (ms):", result[f"mean_{key}_ms"]))
    lines.append(row(f"Median {word} (ms):", result[f"median_{key}_ms"]))
    for label in percentile_labels(result, key):
        lines.append(row(f"P{label} {word} (ms):", result[f"p{label}_{key}_ms"]))
    return lines


def percentile_labels(result: dict, key: str) -> list[str]:
    """The NN of every `pNN_<key>_ms` in the result, in increasing order."""
    pattern = re.compile(rf"p([0-9.]+)_{key}_ms")
    labels = [m.group(1) for k in result if (m := pattern.fullmatch(k))]
    return sorted(labels, key=float)


def error_lines(result: dict) -> list[str]:
    errors = list(dict.fromkeys(e for e in result.get("errors", []) if e))
    if not errors:
        return []
    lines = [f"Errors by HTTP status (0: no response): {result.get('errors_by_status')}"]
    lines += [f"  {error}" for error in errors[:MAX_ERRORS_SHOWN]]
    if len(errors) > MAX_ERRORS_SHOWN:
        lines.append(f"  ... and {len(errors) - MAX_ERRORS_SHOWN} more distinct errors")
    return lines


def heading(title: str, fill: str) -> str:
    return f"{title:{fill}^{WIDTH}}"


def row(name: str, value: object) -> str:
    text = f"{value:.2f}" if isinstance(value, float) else str(value)
    return f"{name:<40} {text:<10}"
