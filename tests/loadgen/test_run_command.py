"""`loadgen run` as a user runs it: flags, files written, exit codes, Ctrl-C."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from loadgen.cli import main
from loadgen.output import load_result
from loadgen.run_command import parse_percentiles
from shared.errors import KvstackError
from tests.e2e.conftest import free_port
from tests.loadgen.conftest import API_KEY, MODEL, REJECT_MAX_TOKENS

REPO = Path(__file__).resolve().parents[2]
TRACE_ROWS = [
    {"timestamp": 0, "input_length": 1100, "output_length": 40, "hash_ids": [1, 2, 3]},
    {"timestamp": 20, "input_length": 1030, "output_length": 30, "hash_ids": [1, 2, 9]},
    {"timestamp": 50, "input_length": 300, "output_length": 100, "hash_ids": [4]},
]


def run_args(server, tmp_path: Path, *extra: str) -> list[str]:
    return [
        "run",
        "--base-url",
        f"{server.url}/v1",
        "--api-key",
        API_KEY,
        "--result-dir",
        str(tmp_path / "results"),
        *extra,
    ]


def only_result(tmp_path: Path) -> dict:
    [path] = (tmp_path / "results").glob("*.json")
    return load_result(path) | {"path": path}


def test_a_random_run_writes_json_records_and_plots(fake_server, tmp_path, capsys) -> None:
    records = tmp_path / "records.jsonl"
    code = main(
        run_args(
            fake_server,
            tmp_path,
            "--num-prompts",
            "4",
            "--input-len",
            "8",
            "--output-len",
            "3",
            "--max-concurrency",
            "2",
            "--goodput",
            "ttft:5000",
            "--metric-percentiles",
            "50,99",
            "--save-records",
            str(records),
        )
    )
    assert code == 0
    result = only_result(tmp_path)
    assert result["path"].name.startswith(f"random-infqps-concurrency2-{MODEL}-")
    assert result["completed"] == 4 and result["total_output_tokens"] == 12
    assert result["model_id"] == MODEL and result["backend"] == "openai"  # from /v1/models
    assert result["request_goodput"] is not None and "p99_client_queue_time_ms" in result
    assert result["dataset"] == {
        "name": "random",
        "vocab_size": 32000,
        "num_prompts": 4,
        "input_len": 8,
        "output_len": 3,
        "range_ratio": 0.0,
    }
    assert len(records.read_text().splitlines()) == 4
    stem = result["path"].stem
    for kind in ("latency-cdf", "throughput", "ttft-over-time"):
        assert (result["path"].parent / f"{stem}-{kind}.png").is_file()
    out = capsys.readouterr()
    assert "Serving Benchmark Result" in out.out and "P99 TTFT (ms)" in out.out
    assert "4/4 done, 0 failed" in out.err
    assert all(body["ignore_eos"] and len(body["prompt"]) == 8 for body in fake_server.bodies)


def test_a_trace_run_keeps_the_traces_schedule(fake_server, tmp_path, capsys) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(row) + "\n" for row in TRACE_ROWS))
    out_json = tmp_path / "trace-run.json"
    code = main(
        run_args(
            fake_server,
            tmp_path,
            "--dataset",
            "mooncake-trace",
            "--trace",
            str(trace),
            "--length-scale",
            "0.05",
            "--time-scale",
            "2",
            "--request-rate",
            "5",
            "--output-json",
            str(out_json),
            "--no-plots",
        )
    )
    assert code == 0
    assert "--request-rate is ignored" in capsys.readouterr().err
    result = load_result(out_json)
    assert result["request_rate"] == "trace" and result["completed"] == 3
    assert result["output_lens"] == [2, 2, 5]  # round(40, 30, 100 * 0.05)
    assert result["start_times"][2] >= 0.1 - 1e-3  # 50 ms at half speed
    prompts = [body["prompt"] for body in fake_server.bodies]
    assert [len(p) for p in prompts] == [56, 53, 15]  # blocks of 26 tokens per hash id
    assert prompts[0][:52] == prompts[1][:52]
    assert not list(tmp_path.glob("*.png"))


def test_all_requests_failing_exits_1_and_still_reports(fake_server, tmp_path, capsys) -> None:
    code = main(
        run_args(
            fake_server,
            tmp_path,
            "--num-prompts",
            "3",
            "--input-len",
            "4",
            "--output-len",
            str(REJECT_MAX_TOKENS),
            "--no-plots",
        )
    )
    assert code == 1
    result = only_result(tmp_path)
    assert result["failed"] == 3 and result["rejected"] == 3
    assert result["errors_by_status"] == {"503": 3}
    assert "HTTP 503: overloaded: queue full" in capsys.readouterr().out


def test_the_key_comes_from_openai_api_key(fake_server, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    args = [
        "run",
        "--base-url",
        fake_server.url,
        "--num-prompts",
        "1",
        "--input-len",
        "2",
        "--output-len",
        "2",
        "--result-dir",
        str(tmp_path / "results"),
        "--no-plots",
    ]
    assert main(args) == 0


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--api-key", "wrong"], "refused the API key"),
        (["--model", "other"], "does not serve model 'other'"),
        (["--metric-percentiles", "50,abc"], "--metric-percentiles"),
        (["--goodput", "ttft"], "--goodput"),
        (["--time-scale", "2"], "--time-scale applies to --dataset mooncake-trace only"),
        (["--dataset", "mooncake-trace"], "needs --dataset-path"),
        (["--dataset", "mooncake-trace", "--trace", "missing.jsonl"], "trace file not found"),
        (["--num-prompts", "0"], "--num-prompts must be at least 1"),
        (["--max-concurrency", "0"], "--max-concurrency"),
    ],
)
def test_usage_errors_exit_2_with_a_clear_message(
    fake_server, tmp_path, capsys, extra, message
) -> None:
    args = run_args(fake_server, tmp_path, "--num-prompts", "1", *extra)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "results").exists()


def test_trace_rows_with_chat_are_refused(fake_server, tmp_path, capsys) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps(TRACE_ROWS[0]) + "\n")
    assert (
        main(
            run_args(
                fake_server,
                tmp_path,
                "--dataset",
                "mooncake-trace",
                "--trace",
                str(trace),
                "--endpoint",
                "chat",
            )
        )
        == 2
    )
    assert "need --endpoint completions" in capsys.readouterr().err


def test_a_bad_trace_row_names_file_and_line(fake_server, tmp_path, capsys) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps(TRACE_ROWS[0]) + "\n" + '{"timestamp": 1}\n')
    assert (
        main(run_args(fake_server, tmp_path, "--dataset", "mooncake-trace", "--trace", str(trace)))
        == 2
    )
    assert f"{trace}:2: 'input_length' must be a number" in capsys.readouterr().err


def test_an_unreachable_url_exits_2_and_names_it(tmp_path, capsys) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["run", "--base-url", url, "--num-prompts", "1"]) == 2
    assert f"cannot reach the server at {url}" in capsys.readouterr().err


def test_argparse_errors_exit_2() -> None:
    with pytest.raises(SystemExit) as info:
        main(["run", "--endpoint", "embeddings"])
    assert info.value.code == 2


def test_parse_percentiles() -> None:
    assert parse_percentiles("50, 90,99.9") == [50.0, 90.0, 99.9]
    for bad in ("", "0", "101", "x"):
        with pytest.raises(KvstackError):
            parse_percentiles(bad)


def test_ctrl_c_writes_what_was_measured(slow_server, tmp_path) -> None:
    out_json = tmp_path / "interrupted.json"
    command = [
        sys.executable,
        "-m",
        "loadgen.cli",
        *run_args(
            slow_server,
            tmp_path,
            "--num-prompts",
            "4",
            "--input-len",
            "4",
            "--output-len",
            "30",
            "--max-concurrency",
            "1",
            "--output-json",
            str(out_json),
            "--no-plots",
        ),
    ]
    process = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    seen = ""
    while "1/4 done" not in seen and process.poll() is None:  # the first progress line
        seen += process.stderr.readline()
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, seen + err
    result = load_result(out_json)
    assert result["interrupted"] and result["completed"] >= 1
    assert result["num_cancelled"] + result["completed"] + result["num_unsent"] == 4
    assert "interrupted" in err and "Serving Benchmark Result" in out


def test_text_prompts_and_extra_body_reach_the_server(fake_server, tmp_path) -> None:
    args = run_args(fake_server, tmp_path, "--num-prompts", "1", "--input-len", "3")
    extra = ["--output-len", "2", "--no-plots", "--text-prompts", "--extra-body", '{"top_k": 1}']
    assert main(args + extra) == 0
    [body] = fake_server.bodies
    assert isinstance(body["prompt"], str) and len(body["prompt"].split()) == 3
    assert body["top_k"] == 1


def test_extra_body_must_be_a_json_object(fake_server, tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(run_args(fake_server, tmp_path, "--extra-body", "[1]"))
    assert exit_info.value.code == 2
    assert "a JSON object is needed" in capsys.readouterr().err
