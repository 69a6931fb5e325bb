"""`loadgen report`: the side-by-side table and the overlaid plots."""

from __future__ import annotations

from pathlib import Path

from loadgen.cli import main
from loadgen.metrics import summarize
from loadgen.output import build_result, save_result
from loadgen.records import RequestRecord
from loadgen.report import column_labels, markdown_table, table_rows, text_table


def make_result(label: str | None, ttft: float, percentiles=(50, 99)) -> dict:
    records = [
        RequestRecord(i, 0.1 * i, 8, 2, ttft=ttft, itl=(0.01,), latency=ttft + 0.01)
        for i in range(4)
    ]
    meta = {"label": label, "request_rate": 2.0, "max_concurrency": None}
    return build_result(summarize(records, 1.0, percentiles=percentiles), records, meta)


def test_labels_fall_back_to_file_stems_where_they_repeat() -> None:
    results = [{"label": "a"}, {"label": "a"}, {"label": None}, {"label": "b"}]
    paths = [Path("x/one.json"), Path("y/two.json"), Path("z/three.json"), Path("b.json")]
    assert column_labels(results, paths) == ["one", "two", "three", "b"]
    assert column_labels([{}, {}], [Path("x/r.json"), Path("y/r.json")]) == ["r (1)", "r (2)"]


def test_rows_are_metrics_and_columns_are_runs() -> None:
    rows = dict(table_rows([make_result("a", 0.1), make_result("b", 0.3, percentiles=(90,))]))
    assert rows["Successful requests"] == [4, 4]
    assert rows["Mean TTFT (ms)"] == [100.0, 300.0]
    assert rows["P90 TTFT (ms)"] == [None, 300.0]  # a percentile only one run has
    assert "Request goodput (req/s)" not in rows  # no run has it
    assert "Max concurrency" not in rows


def test_text_and_markdown_tables() -> None:
    rows = [("Mean TTFT (ms)", [100.0, None]), ("Successful requests", [4, 3])]
    text = text_table(["a", "b"], rows).splitlines()
    assert text[0].split() == ["metric", "a", "b"]
    assert text[2].split() == ["Mean", "TTFT", "(ms)", "100.00", "-"]
    md = markdown_table(["a", "b"], rows).splitlines()
    assert md[:2] == ["| metric | a | b |", "| --- | ---: | ---: |"]
    assert md[3] == "| Successful requests | 4 | 3 |"


def test_report_command(tmp_path, capsys) -> None:
    a = save_result(make_result("fast", 0.1), tmp_path / "fast.json")
    b = save_result(make_result("slow", 0.3), tmp_path / "slow.json")
    assert main(["report", str(a), str(b), "--markdown", "--plot-dir", str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    assert "| metric | fast | slow |" in out and "| Mean TTFT (ms) | 100.00 | 300.00 |" in out
    assert (tmp_path / "p" / "compare-latency-cdf.png").is_file()


def test_report_of_a_missing_file_is_a_clear_error(tmp_path, capsys) -> None:
    assert main(["report", str(tmp_path / "nope.json")]) == 2
    assert "result file not found" in capsys.readouterr().err
