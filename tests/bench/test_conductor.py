"""`python -m bench conductor` as a user runs it, in a small configuration."""

from __future__ import annotations

import json
import subprocess
import sys

from shared.conductor.config import POLICY_NAMES


def test_json_report_has_every_row_with_positive_numbers() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "conductor",
            "--workers",
            "4",
            "--blocks",
            "20000",
            "--decisions",
            "200",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "blocks indexed" in result.stderr  # progress goes to stderr
    report = json.loads(result.stdout)
    assert report["indexed_blocks"] == 20000 and report["prefill_workers"] == 4
    rows = {(r["policy"], r["admission"], r["match"]): r for r in report["results"]}
    assert {policy for policy, _, _ in rows} == set(POLICY_NAMES)
    assert ("kvcentric", "predictive-request", "binary search") in rows
    assert ("kvcentric", "none", "walk") in rows
    for row in rows.values():
        assert row["decisions"] == 200 and 0 < row["accepted"] <= 200
        for field in ("decisions_per_s", "mean_ms", "p50_ms", "p99_ms", "max_ms"):
            assert row[field] > 0, (row, field)
        assert row["p50_ms"] <= row["p99_ms"] <= row["max_ms"]
