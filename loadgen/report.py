"""`loadgen report A.json B.json ...`: runs side by side, one column per run and one row
per metric (as text or as a Markdown table), and overlaid plots of their latency CDFs and
throughput. Reads any result document that `loadgen run` or `loadgen sim` wrote (a
`loadgen sim` result has no per-request records, so it is left out of the plots)."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from loadgen.console import LATENCIES, percentile_labels
from loadgen.output import has_records, load_result

# (key in the result, row name)
TOTALS = (
    ("completed", "Successful requests"),
    ("failed", "Failed requests"),
    ("rejected", "Rejected requests (429/503)"),
    ("request_rate", "Request rate (req/s)"),
    ("max_concurrency", "Max concurrency"),
    ("duration", "Duration (s)"),
    ("total_input_tokens", "Input tokens"),
    ("cached_tokens", "Cached input tokens"),
    ("total_output_tokens", "Output tokens"),
    ("request_throughput", "Request throughput (req/s)"),
    ("request_goodput", "Request goodput (req/s)"),
    ("slo_attainment", "SLO attainment (good / sent)"),
    ("output_throughput", "Output throughput (tok/s)"),
    ("total_token_throughput", "Total token throughput (tok/s)"),
    ("max_output_tokens_per_s", "Peak output throughput (tok/s)"),
    ("max_concurrent_requests", "Peak concurrent requests"),
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="compare result JSON files side by side", description=__doc__)
    p.add_argument("results", nargs="+", metavar="RESULT.json")
    p.add_argument("--markdown", action="store_true", help="print a Markdown table")
    p.add_argument("--plot-dir", help="write overlaid plots (compare-*.png) here")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    paths = [Path(p) for p in args.results]
    results = [load_result(path) for path in paths]
    labels = column_labels(results, paths)
    rows = table_rows(results)
    print(markdown_table(labels, rows) if args.markdown else text_table(labels, rows))
    if args.plot_dir:
        plot_runs(list(zip(labels, results)), Path(args.plot_dir))
    return 0


def plot_runs(runs: list[tuple[str, dict]], out_dir: Path) -> None:
    """The plots are drawn from per-request records, which `loadgen sim` results lack."""
    from loadgen.plots import plot_compare  # matplotlib loads only when plotting

    missing = [label for label, result in runs if not has_records(result)]
    if missing:
        print(f"not plotted (no per-request records): {', '.join(missing)}", file=sys.stderr)
    runs = [(label, result) for label, result in runs if has_records(result)]
    for plot in plot_compare(runs, out_dir, "compare-") if runs else []:
        print(f"plot: {plot}")


def column_labels(results: Sequence[dict], paths: Sequence[Path]) -> list[str]:
    """Each run's label; the file stem where labels repeat (or are missing)."""
    labels = [result.get("label") or path.stem for result, path in zip(results, paths)]
    counts = Counter(labels)
    labels = [path.stem if counts[label] > 1 else label for label, path in zip(labels, paths)]
    counts = Counter(labels)
    return [f"{label} ({i + 1})" if counts[label] > 1 else label for i, label in enumerate(labels)]


def table_rows(results: Sequence[dict]) -> list[tuple[str, list]]:
    """(row name, one value per run); rows no run has are left out."""
    keys = list(TOTALS) + latency_keys(results)
    rows = [(name, [result.get(key) for result in results]) for key, name in keys]
    return [(name, values) for name, values in rows if any(v is not None for v in values)]


def latency_keys(results: Sequence[dict]) -> list[tuple[str, str]]:
    keys = []
    for key, word, _, _ in LATENCIES:
        labels = sorted({p for r in results for p in percentile_labels(r, key)}, key=float)
        keys += [
            (f"mean_{key}_ms", f"Mean {word} (ms)"),
            (f"median_{key}_ms", f"Median {word} (ms)"),
        ]
        keys += [(f"p{label}_{key}_ms", f"P{label} {word} (ms)") for label in labels]
    return keys


def cell(value) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def text_table(labels: Sequence[str], rows: Sequence[tuple[str, list]]) -> str:
    cells = [["metric", *labels]] + [[name, *map(cell, values)] for name, values in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    lines = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
        for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(labels: Sequence[str], rows: Sequence[tuple[str, list]]) -> str:
    lines = ["| metric | " + " | ".join(labels) + " |", "| --- |" + " ---: |" * len(labels)]
    lines += ["| " + " | ".join([name, *map(cell, values)]) + " |" for name, values in rows]
    return "\n".join(lines)
