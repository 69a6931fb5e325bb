"""`loadgen trace import`: BurstGPT and Azure CSVs (fixtures with the real headers) become
Mooncake traces whose blocks are all distinct."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadgen.cli import main
from loadgen.trace import load_trace
from loadgen.traceimport import azure_time, import_csv
from loadgen.tracestats import infinite_cache_hit_ratio
from shared.errors import KvstackError

DATA = Path(__file__).parent / "data"
BURSTGPT = DATA / "burstgpt_sample.csv"
AZURE = DATA / "azure_sample.csv"


def test_burstgpt_rows_without_tokens_are_skipped_and_counted() -> None:
    imported = import_csv(BURSTGPT, "burstgpt")
    assert [(r.timestamp, r.input_length, r.output_length) for r in imported.rows] == [
        (0.0, 472, 18),
        (113.0, 417, 217),
        (129.0, 1360, 334),
    ]
    assert imported.skipped == 2


def test_every_block_gets_a_fresh_id() -> None:
    rows = import_csv(BURSTGPT, "burstgpt").rows
    assert [r.hash_ids for r in rows] == [(0,), (1,), (2, 3, 4)]
    assert infinite_cache_hit_ratio(rows) == 0.0


def test_burstgpt_model_filter_and_max_requests() -> None:
    assert [r.input_length for r in import_csv(BURSTGPT, "burstgpt", model="GPT-4").rows] == [417]
    assert len(import_csv(BURSTGPT, "burstgpt", max_requests=2).rows) == 2


def test_azure_timestamps_keep_seven_fractional_digits() -> None:
    imported = import_csv(AZURE, "azure")
    times = [r.timestamp for r in imported.rows]
    assert times == pytest.approx([0.0, 4.314579, 14.31941], abs=1e-6)
    assert [r.input_length for r in imported.rows] == [374, 396, 2048]
    assert imported.skipped == 1
    assert azure_time("2023-11-16 00:00:01") - azure_time("2023-11-16 00:00:00.5") == 0.5


def test_a_missing_column_is_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("Timestamp,Model,Request tokens\n1,ChatGPT,10\n")
    with pytest.raises(KvstackError, match=r"missing column.*'Response tokens'"):
        import_csv(path, "burstgpt")


def test_a_bad_number_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,12,x\n")
    with pytest.raises(KvstackError, match=r"bad.csv:2: 'GeneratedTokens' cannot be read"):
        import_csv(path, "azure")


def test_the_command_writes_a_trace_that_loads(tmp_path: Path, capsys) -> None:
    out = tmp_path / "burst.jsonl"
    assert main(["trace", "import", str(BURSTGPT), "--format", "burstgpt", "-o", str(out)]) == 0
    assert len(load_trace(out)) == 3
    assert "skipped 2" in capsys.readouterr().err


def test_model_filter_on_azure_is_a_usage_error(tmp_path: Path, capsys) -> None:
    argv = ["trace", "import", str(AZURE), "--format", "azure", "--model", "GPT-4"]
    assert main([*argv, "-o", str(tmp_path / "a.jsonl")]) == 2
    assert "--model applies to --format burstgpt only" in capsys.readouterr().err
