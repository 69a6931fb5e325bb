"""PNG plots of one run and of several overlaid."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from loadgen.metrics import summarize
from loadgen.output import build_result
from loadgen.plots import latencies_ms, plot_compare, plot_run, throughput_series
from loadgen.records import RequestRecord

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def make_result(label: str, scale: float = 1.0, failed: bool = False) -> dict:
    records = [
        RequestRecord(
            i,
            start_time=0.1 * i,
            input_len=8,
            output_len=4,
            ttft=0.05 * scale * (i + 1),
            itl=(0.01 * scale,) * 3,
            latency=0.05 * scale * (i + 1) + 0.03 * scale,
        )
        for i in range(10)
    ]
    if failed:
        records = [RequestRecord(i, 0.1 * i, 8, status=503, error="HTTP 503") for i in range(3)]
    return build_result(summarize(records, 2.0), records, {"label": label})


def assert_pngs(paths, names) -> None:
    assert [p.name for p in paths] == names
    for path in paths:
        assert path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 10_000


def test_plot_run_writes_three_pngs(tmp_path) -> None:
    paths = plot_run(make_result("a"), tmp_path / "plots", prefix="run1-")
    assert_pngs(paths, ["run1-latency-cdf.png", "run1-throughput.png", "run1-ttft-over-time.png"])


def test_a_run_where_everything_failed_still_plots(tmp_path) -> None:
    assert_pngs(
        plot_run(make_result("bad", failed=True), tmp_path),
        ["latency-cdf.png", "throughput.png", "ttft-over-time.png"],
    )


def test_plot_compare_overlays_runs(tmp_path) -> None:
    runs = [("fast", make_result("fast")), ("slow", make_result("slow", scale=3.0))]
    assert_pngs(
        plot_compare(runs, tmp_path, "compare-"),
        ["compare-latency-cdf.png", "compare-throughput.png"],
    )


def test_series_behind_the_plots() -> None:
    records = [
        RequestRecord(0, 0.0, 1, 3, ttft=0.5, itl=(0.5, 1.0), latency=2.0),
        RequestRecord(1, 1.0, 1, 1, ttft=0.25, latency=0.25),
    ]
    values = latencies_ms(records)
    assert values["ttft"].tolist() == [250.0, 500.0]
    assert values["tpot"].tolist() == [750.0]  # one-token answers have no TPOT
    assert values["itl"].tolist() == [500.0, 1000.0]
    edges, rates = throughput_series(records)  # token events at 0.5, 1.0, 1.25, 2.0
    width = edges[1]
    assert width == pytest.approx(0.1) and edges.size == rates.size + 1
    assert rates.sum() * width == pytest.approx(4)
    assert np.count_nonzero(rates) == 4


def test_plots_without_matplotlib_are_a_usage_error(tmp_path) -> None:
    # matplotlib is the `bench` extra: `--plot-dir` without it says what to install.
    without_matplotlib = "import sys; sys.modules['matplotlib'] = None; "
    sim = "from loadgen.cli import main; sys.exit(main(sys.argv[1:]))"
    trace = Path(__file__).parent / "data" / "mooncake_slice.jsonl"
    args = ["--trace", str(trace), "--prefill", "1", "--decode", "1", "--quiet"]
    result = subprocess.run(
        [sys.executable, "-c", without_matplotlib + sim, "sim", *args, "--plot-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "plots need matplotlib: pip install 'kvstack[bench]'" in result.stderr
    assert not list(tmp_path.iterdir())


def test_a_run_without_matplotlib_writes_its_json_and_skips_the_default_plots(
    tmp_path, monkeypatch, capsys
) -> None:
    # A runtime install has no matplotlib: the default plots are skipped with a note.
    import argparse

    from loadgen.run_command import write_outputs

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    path = tmp_path / "run.json"
    args = argparse.Namespace(
        output_json=str(path), save_records=None, no_plots=False, plot_dir=None
    )
    write_outputs(make_result("run"), args)
    assert path.exists() and [p.name for p in tmp_path.iterdir()] == ["run.json"]
    assert "no plots: plots need matplotlib" in capsys.readouterr().err
