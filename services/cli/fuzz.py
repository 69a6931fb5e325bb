"""`kvstack fuzz`: schemathesis against a running gateway (its GET /openapi.json), a summary
table per operation and mode, then the failures; exit code 1 when any check failed."""

from __future__ import annotations

import argparse
import os

from shared.errors import KvstackError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fuzz", help="fuzz a running gateway against its OpenAPI document")
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="the gateway")
    p.add_argument(
        "--api-key",
        default=os.environ.get("KVSTACK_API_KEY", ""),
        help="its bearer key (env KVSTACK_API_KEY)",
    )
    p.add_argument("--max-examples", type=int, default=200, help="per operation and mode")
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="the same seed generates the same data (default: random)",
    )
    p.add_argument("--show", type=int, default=3, help="failures printed per operation")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        from services.cli.fuzz_runner import FuzzConfig, fuzz
    except ImportError as e:
        raise KvstackError(f"kvstack fuzz needs the dev extra (schemathesis): {e}") from None
    import requests

    config = FuzzConfig(args.base_url.rstrip("/"), args.api_key, args.max_examples, args.seed)
    try:
        reports = fuzz(config)
    except requests.RequestException as e:
        raise KvstackError(f"cannot reach {config.base_url}/openapi.json: {e}") from None
    print(table(reports))
    for report in reports:
        for failure in report.failures[: args.show]:
            print(f"\n--- {report.operation} ({report.mode}) ---\n{failure}")
    return 1 if any(report.failures for report in reports) else 0


def table(reports) -> str:
    """One row per operation and mode: cases, answers by status class, failures, time."""
    header = ("operation", "mode", "cases", "2xx", "4xx", "5xx", "failed", "seconds")
    rows = [header] + [
        (
            r.operation,
            r.mode,
            str(r.cases),
            *_by_class(r.statuses),
            str(len(r.failures)),
            f"{r.seconds:.1f}",
        )
        for r in reports
    ]
    rows.append(
        (
            "total",
            "",
            str(sum(r.cases for r in reports)),
            "",
            "",
            "",
            str(sum(len(r.failures) for r in reports)),
            f"{sum(r.seconds for r in reports):.1f}",
        )
    )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(
            cell.ljust(w) if i < 2 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths))
        )
        for row in rows
    )


def _by_class(statuses) -> tuple[str, str, str]:
    ok, refused, failed = (
        sum(n for status, n in statuses.items() if status // 100 == c) for c in (2, 4, 5)
    )
    return str(ok), str(refused), str(failed)
