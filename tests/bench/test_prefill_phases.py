"""prefill-phases times the parts of a real engine's prefill of one prompt: the linears, the
attention, the norms and the rest add up to the step, the linears' rate is counted from their
shapes, and the timers are gone afterwards."""

from __future__ import annotations

import argparse

import orjson
import pytest
import torch

from bench.cli import build_parser
from bench.prefill_phases import build_engine, timing
from shared.errors import KvstackError
from shared.model import ops
from shared.model.kernels import cpu_ops

pytestmark = pytest.mark.skipif(cpu_ops() is None, reason="the shipped model's quantized layers")


@pytest.fixture(autouse=True)
def torch_threads_kept():
    """The benchmark sets torch's threads for this process: the next tests get theirs back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_the_parts_of_a_prefill_add_up_to_the_step(capsys) -> None:
    args = build_parser().parse_args(
        ["prefill-phases", "--prompt-len", "64", "--rounds", "1", "--gemm-size", "128", "--json"]
    )
    assert args.run(args) == 0
    report = orjson.loads(capsys.readouterr().out)
    parts = report["parts_ms"]
    timed = ("linears", "attention", "norms", "rotary", "SiLU and multiply", "embedding")
    assert all(parts[name] > 0 for name in timed)
    assert parts["linears"] == max(parts.values())  # a prompt's time is its matmuls
    assert sum(parts.values()) == pytest.approx(report["prefill_ms"], abs=0.05)
    # SmolLM2-135M's 30 layers: qkv 576 -> 960, o 576 -> 576, gate_up 576 -> 3072, down
    # 1536 -> 576; 2 FLOPs a multiply-add, 64 tokens
    per_token = 30 * 2 * (576 * 960 + 576 * 576 + 576 * 3072 + 1536 * 576)
    assert report["linear_gflop"] == pytest.approx(64 * per_token / 1e9, abs=0.01)
    assert report["linears_gflop_s"] > 0 and report["gemm_gflop_s"] > 0
    assert report["linears_alone_ms"] > 0


def test_the_timers_are_taken_out_again() -> None:
    args = argparse.Namespace(
        model="SmolLM2-135M-Instruct",
        dtype="auto",
        weights="auto",
        prefill_weights="auto",
        threads=1,
        prompt_len=16,
    )
    engine = build_engine(args)
    rotary, forward = ops.rotary_, engine._runner.backend.forward
    with timing(engine) as timers:
        assert ops.rotary_ is not rotary
    assert not timers.spent and ops.rotary_ is rotary
    assert engine._runner.backend.forward == forward
    assert "forward" not in engine._runner.backend.__dict__


def test_bad_sizes_are_a_clear_error() -> None:
    args = build_parser().parse_args(["prefill-phases", "--prompt-len", "0"])
    with pytest.raises(KvstackError, match="must be positive"):
        args.run(args)
