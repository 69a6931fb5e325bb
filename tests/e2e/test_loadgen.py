"""`loadgen run` against a whole kvstack: what it measures matches what was asked for, and
trace requests that share a prefix with an earlier one are served partly from cache."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from loadgen.cli import main
from loadgen.output import load_result
from tests.e2e.conftest import API_KEY, free_port

TRACE_SLICE = Path(__file__).parents[1] / "loadgen" / "data" / "mooncake_slice.jsonl"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def loadgen_run(stack, tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "result.json"
    code = main(
        ["run", "--base-url", stack.api_url, "--api-key", API_KEY, "--output-json", str(out), *args]
    )
    assert code == 0
    return load_result(out)


def test_random_dataset(stack, tmp_path) -> None:
    result = loadgen_run(
        stack,
        tmp_path,
        "--num-prompts",
        "6",
        "--input-len",
        "32",
        "--output-len",
        "8",
        "--max-concurrency",
        "2",
    )
    assert result["completed"] == 6 and result["failed"] == 0
    assert result["model_id"] == "SmolLM2-135M-Instruct"  # from GET /v1/models
    assert result["max_concurrent_requests"] <= 2
    for record in result["records"]:
        assert record["input_len"] == 32 and record["output_len"] == 8  # ignore_eos
        assert 0 < record["ttft"] <= record["latency"]
        # an event a decode step: the 7 tokens after the first in 7 events, or fewer where
        # the decode worker chained steps (--decode-burst 4: at least 2)
        assert 2 <= len(record["itl"]) <= 7
    for kind in ("latency-cdf", "throughput", "ttft-over-time"):
        assert (tmp_path / f"result-{kind}.png").read_bytes()[:8] == PNG_MAGIC


def test_mooncake_trace_slice_shares_prefixes(stack, tmp_path) -> None:
    # Rows 15, 57, 58, 61, 74 of Mooncake's synthetic trace: 58 and 74 share 5 and 6 blocks
    # with 15, 61 shares 28 with 57. One at a time, so each earlier prefill has finished.
    result = loadgen_run(
        stack,
        tmp_path,
        "--dataset",
        "mooncake-trace",
        "--trace",
        str(TRACE_SLICE),
        "--length-scale",
        "0.05",
        "--time-scale",
        "0.05",
        "--max-concurrency",
        "1",
        "--no-plots",
    )
    assert result["completed"] == 5
    records = result["records"]
    # 26 tokens per hash id (round(512 * 0.05)); the last block scaled, outputs at least 1
    assert [r["input_len"] for r in records] == [140, 742, 140, 769, 140]
    assert [r["output_len"] for r in records] == [2, 2, 2, 1, 2]
    assert records[0]["cached_tokens"] == 0
    assert all(r["cached_tokens"] > 0 for r in records[2:])
    assert records[3]["cached_tokens"] >= 28 * 26 // 16 * 16  # whole 16-token KV blocks


def test_a_wrong_key_is_a_clear_error(stack, capsys) -> None:
    assert (
        main(["run", "--base-url", stack.api_url, "--api-key", "wrong", "--num-prompts", "1"]) == 2
    )
    assert "refused the API key" in capsys.readouterr().err


def test_the_console_script_names_an_unreachable_url() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    script = Path(sys.executable).parent / "loadgen"
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "loadgen.cli"]
    done = subprocess.run(
        [*command, "run", "--base-url", url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert url in done.stderr and "Traceback" not in done.stderr
