"""Calibrated on this machine, the cost model predicts the time to first token of single
requests within 25% of the measured one (median): `kvstack profile` is run as a user would,
against a running stack, and its predictions are checked on prompts it never saw.

A timed check (`pytest -m timed tests/e2e/test_costmodel_ttft.py -rP`), not part of the
default suite: its result depends on the machine staying as fast as when it was profiled.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.stack.stack import Stack
from shared import costmodel
from shared.costmodel.fitted import FittedCostModel
from shared.costmodel.overhead import first_token_seconds
from shared.model.config import ModelConfig
from shared.profiling import Prompts
from tests.e2e.conftest import WORKER_ARGS, running_stack

pytestmark = pytest.mark.timed

LENGTHS = (64, 128, 256, 384, 512, 768, 1024, 1500)  # prompt tokens
ROUNDS = 2  # single requests of each length
TOLERANCE = 0.25


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory, smollm2_dir) -> Iterator[tuple[Stack, FittedCostModel]]:
    """A 1 prefill + 1 decode stack, and a profile taken as its workers run (same dtype and
    threads), with the request overhead measured at its gateway."""
    logs = tmp_path_factory.mktemp("costmodel-ttft")
    with running_stack(logs, prefill_args=("--no-prefix-cache",)) as stack:
        yield stack, profile(stack, logs / "profile.json")


def profile(stack: Stack, out: Path) -> FittedCostModel:
    dtype, threads = worker_arg("--dtype"), worker_arg("--threads")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "services.cli.main",
            "profile",
            "--quick",
            "--dtype",
            dtype,
            "--threads",
            threads,
            "--gateway",
            stack.api_url,
            "--out",
            str(out),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    print(result.stdout)
    cost = costmodel.load(out)
    assert (cost.dtype, cost.threads) == (dtype, int(threads))
    return cost


def worker_arg(name: str) -> str:
    return WORKER_ARGS[WORKER_ARGS.index(name) + 1]


def test_predicted_ttft_of_single_requests_is_within_25_percent(calibrated, smollm2_dir) -> None:
    stack, cost = calibrated
    prompts = Prompts(ModelConfig.from_dir(smollm2_dir).vocab_size, seed=None)
    first_token_seconds(stack.api_url, prompts.fresh(32))  # warm-up
    measured = measure_ttft(stack.api_url, prompts)
    rows = [(n, measured[n], cost.prefill_time(n, 0) + cost.request_overhead) for n in LENGTHS]
    errors = [abs(predicted - seconds) / seconds for _, seconds, predicted in rows]
    print_table(rows, errors, cost.request_overhead)
    assert statistics.median(errors) <= TOLERANCE


def measure_ttft(api_url: str, prompts: Prompts) -> dict[int, float]:
    """The mean of ROUNDS single requests of each length (new prompts every time), in
    rounds over all lengths as the profile measures: a burst of load elsewhere then spoils
    one run of several lengths rather than every run of one."""
    runs: dict[int, list[float]] = {n: [] for n in LENGTHS}
    for _ in range(ROUNDS):
        for n in LENGTHS:
            runs[n].append(first_token_seconds(api_url, prompts.fresh(n)))
    return {n: statistics.mean(seconds) for n, seconds in runs.items()}


def print_table(rows: list[tuple[int, float, float]], errors: list[float], overhead: float) -> None:
    print(f"\nTTFT, single requests (request overhead {overhead * 1000:.1f} ms)")
    print(" tokens  measured ms  predicted ms   error")
    for (n, measured, predicted), error in zip(rows, errors):
        print(f"{n:7} {measured * 1000:12.1f} {predicted * 1000:13.1f} {error:7.1%}")
    print(f"median error {statistics.median(errors):.1%}")
