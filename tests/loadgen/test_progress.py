"""The progress line: counts, failures, and rate-limited redraws."""

from __future__ import annotations

import io

from loadgen.progress import Progress


def test_lines_show_completed_total_and_failures() -> None:
    out = io.StringIO()
    progress = Progress(4, out, log_interval=0.0)
    for success in (True, False, True):
        progress.update(success)
    progress.close("interrupted")
    lines = out.getvalue().splitlines()
    assert len(lines) == 4  # not a terminal: one line per redraw
    assert lines[1].startswith("[############............] 2/4 done, 1 failed")
    assert lines[-1].endswith("(interrupted)") and "3/4 done, 1 failed" in lines[-1]


def test_redraws_are_rate_limited() -> None:
    out = io.StringIO()
    progress = Progress(1000, out, log_interval=3600.0)
    for _ in range(1000):
        progress.update(True)
    progress.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2  # the first update and the final line
    assert "1000/1000 done, 0 failed" in lines[-1]
