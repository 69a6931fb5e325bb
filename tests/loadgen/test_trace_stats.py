"""`loadgen trace stats` on a hand-made trace whose numbers are worked out below."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from loadgen.cli import main
from loadgen.trace import TraceRow, load_trace, write_trace
from loadgen.tracestats import session_of, trace_stats

# r0 2 full blocks; r1 resends r0 and its answer (1024 + 10 <= 1500): a continuation;
# r2 shares r0's first block only; r3 continues r1 (its full blocks are 1, 2); r4 alone.
ROWS = [
    TraceRow(0.0, 1024, 10, (1, 2)),
    TraceRow(1.0, 1500, 20, (1, 2, 3)),
    TraceRow(3.0, 600, 5, (1, 4)),
    TraceRow(4.0, 2000, 7, (1, 2, 3, 5)),
    TraceRow(6.0, 100, 1, (6,)),
]


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.jsonl"
    write_trace(path, ROWS)
    return path


def test_arrivals(trace: Path) -> None:
    stats = trace_stats(load_trace(trace))
    assert (stats.requests, stats.duration, stats.rate) == (5, 6.0, 5 / 6)
    # gaps 1, 2, 1, 2: mean 1.5, std 0.5
    assert stats.interarrival_cv == pytest.approx(1 / 3)
    assert stats.burstiness == pytest.approx(9.0)


def test_lengths(trace: Path) -> None:
    stats = trace_stats(load_trace(trace))
    # sorted inputs 100, 600, 1024, 1500, 2000; numpy's linear interpolation
    assert stats.input.mean == pytest.approx(5224 / 5)
    assert (stats.input.p50, stats.input.p90, stats.input.p99) == pytest.approx((1024, 1800, 1980))
    assert (stats.input.max, stats.output.max) == (2000, 20)


def test_reuse(trace: Path) -> None:
    stats = trace_stats(load_trace(trace))
    # blocks seen before: r1 two, r2 one, r3 three; of 2 + 3 + 2 + 4 + 1
    assert stats.reuse_ceiling == 6 / 12
    assert stats.reusable_token_share == pytest.approx((1024 + 512 + 1536) / 5224)


def test_prefixes_and_sessions(trace: Path) -> None:
    stats = trace_stats(load_trace(trace))
    assert stats.prefixes.shared_share == pytest.approx(3 / 5)
    assert stats.prefixes.distinct_first_blocks == 2
    assert stats.prefixes.top_first_blocks == pytest.approx((0.8, 0.2))
    assert session_of(ROWS) == [0, 0, 2, 0, 4]
    sessions = stats.sessions
    assert (sessions.sessions, sessions.multi_turn, sessions.turns_max) == (3, 1, 3)
    assert (sessions.multi_turn_share, sessions.turns_mean) == (pytest.approx(0.6), 3.0)


def test_a_continuation_holds_the_earlier_prompt_and_answer() -> None:
    document = TraceRow(0.0, 1100, 50, (1, 2, 3))
    # Another question on the same document: shorter than 1100 + 50, so a new session.
    assert session_of([document, TraceRow(1.0, 1149, 9, (1, 2, 4))]) == [0, 1]
    assert session_of([document, TraceRow(1.0, 1150, 9, (1, 2, 4))]) == [0, 0]


def test_a_request_is_continued_once() -> None:
    rows = [
        TraceRow(0.0, 1100, 50, (1, 2, 3)),
        TraceRow(1.0, 1700, 9, (1, 2, 4, 5)),  # continues row 0
        TraceRow(2.0, 1800, 9, (1, 2, 6, 7)),  # would too: a branch, so a new session
    ]
    assert session_of(rows) == [0, 0, 2]


def test_empty_gaps_leave_burstiness_undefined() -> None:
    stats = trace_stats([TraceRow(0.0, 10, 1, (0,)), TraceRow(0.0, 10, 1, (1,))])
    assert (stats.rate, stats.interarrival_cv, stats.burstiness) == (None, None, None)


def test_the_command_prints_a_table_or_json(trace: Path, capsys) -> None:
    assert main(["trace", "stats", str(trace)]) == 0
    table = capsys.readouterr().out
    assert "reuse ceiling         0.500" in table and "requests              5" in table
    assert main(["trace", "stats", str(trace), "--json"]) == 0
    data = orjson.loads(capsys.readouterr().out)
    assert (data["requests"], data["reuse_ceiling"], data["sessions"]["multi_turn"]) == (5, 0.5, 1)


def test_a_missing_file_is_a_usage_error(tmp_path: Path, capsys) -> None:
    assert main(["trace", "stats", str(tmp_path / "none.jsonl")]) == 2
    assert "trace file not found" in capsys.readouterr().err
