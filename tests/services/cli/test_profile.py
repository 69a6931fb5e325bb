"""`kvstack profile` as a user runs it, on a small random model: a subprocess that measures
the real engine, writes a cost model and reports how well it fits."""

from __future__ import annotations

import subprocess
import sys

import pytest

from shared import costmodel
from shared.costmodel.fitted import FittedCostModel


def kvstack(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "services.cli.main", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def profiled(tiny_llama_dir, tmp_path_factory) -> tuple[subprocess.CompletedProcess, str]:
    out = tmp_path_factory.mktemp("profile") / "tiny.json"
    result = kvstack(
        "profile",
        "--model",
        str(tiny_llama_dir),
        "--grid",
        "tiny",
        "--dtype",
        "float32",
        "--threads",
        "1",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    return result, str(out)


def test_the_profile_is_written_with_how_it_was_measured(profiled, tiny_llama_dir) -> None:
    cost = costmodel.from_spec(profiled[1])
    assert isinstance(cost, FittedCostModel)
    assert (cost.model, cost.dtype, cost.threads) == (str(tiny_llama_dir), "float32", 1)
    assert cost.kv_bytes_per_token == 2 * 2 * 2 * 16 * 4  # layers, K+V, kv heads, dim, fp32
    assert cost.link_bw > 0 and cost.request_overhead == 0.0


def test_predictions_are_positive_and_grow_with_the_prompt(profiled) -> None:
    cost = costmodel.load(profiled[1])
    # NOTE: far apart points only: this model's steps take about a millisecond, and a busy
    # machine blurs differences of a tenth of one.
    times = [cost.prefill_time(n, 0) for n in (8, 128, 256)]
    assert 0 < times[0] <= times[1] <= times[2] and times[0] < times[2]
    assert cost.prefill_time(128, 128) > 0
    assert 0 < cost.decode_step_time(1, 32) < cost.decode_step_time(4, 4 * 128)
    assert cost.transfer_time(1e6) > cost.transfer_time(0) >= 0


def test_progress_goes_to_stderr_and_the_fit_report_to_stdout(profiled) -> None:
    result = profiled[0]
    assert "[profile] prefill round 1/3, 1/6 (8, 0):" in result.stderr
    assert "[profile] decode round 3/3, 4/4 (4, 128):" in result.stderr
    assert "prefill new=    8 cached=    0: measured" in result.stdout
    assert "prefill fit: median error" in result.stdout
    assert "request overhead: not measured" in result.stdout


def test_a_grid_longer_than_the_models_context_is_a_clear_error(tiny_llama_dir) -> None:
    result = kvstack("profile", "--model", str(tiny_llama_dir), "--quick", "--out", "/dev/null")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "the model takes 512" in result.stderr


def test_an_unreachable_gateway_fails_before_measuring(tiny_llama_dir) -> None:
    result = kvstack(
        "profile",
        "--model",
        str(tiny_llama_dir),
        "--grid",
        "tiny",
        "--gateway",
        "http://127.0.0.1:9",
        "--out",
        "/dev/null",
    )
    assert result.returncode == 2 and "[profile]" not in result.stderr
    assert "cannot reach the gateway at http://127.0.0.1:9" in result.stderr
