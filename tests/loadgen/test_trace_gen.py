"""`loadgen trace gen`: valid, deterministic, prefix-chained traces whose rate, burstiness
and reuse are what was asked."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from loadgen.cli import build_parser, main
from loadgen.trace import load_trace
from loadgen.trace_command import gen_params
from loadgen.tracegen import hashids
from loadgen.tracegen.generate import build
from loadgen.tracegen.params import GenParams
from loadgen.tracegen.plan import plan
from loadgen.tracegen.presets import PRESETS
from loadgen.tracegen.tune import generate
from loadgen.tracestats import trace_stats

# Every feature at once, small: sessions, shared prefixes, long outliers, a full context.
RICH = GenParams(
    requests=400,
    rate=5.0,
    input_mean=1200,
    input_max=16384,
    session_share=0.5,
    think_time=5.0,
    system_prompts=3,
    system_tokens=1500,
    system_sigma=0.5,
    long_share=0.05,
    long_input=12000,
)


def gen(tmp_path: Path, *flags: str, name: str = "t.jsonl") -> Path:
    path = tmp_path / name
    assert main(["trace", "gen", "--quiet", "-o", str(path), *flags]) == 0
    return path


def test_a_generated_trace_loads(tmp_path: Path) -> None:
    rows = load_trace(gen(tmp_path, "--requests", "300", "--session-share", "0.4"))
    assert len(rows) == 300 and rows[0].timestamp == 0.0


def test_same_seed_same_bytes_other_seed_other_trace(tmp_path: Path) -> None:
    flags = ("--preset", "mixed", "--requests", "200")
    first = gen(tmp_path, *flags, name="a.jsonl").read_bytes()
    assert gen(tmp_path, *flags, name="b.jsonl").read_bytes() == first
    assert gen(tmp_path, *flags, "--seed", "1", name="c.jsonl").read_bytes() != first


def test_an_id_always_has_the_same_position_and_predecessor() -> None:
    """Equivalent to: rows sharing an id at position i share every id before it."""
    rows = build(RICH)
    seen: dict[int, tuple[int, int | None]] = {}
    for row in rows:
        for position, block_hash in enumerate(row.hash_ids):
            before = row.hash_ids[position - 1] if position else None
            assert seen.setdefault(block_hash, (position, before)) == (position, before)
    assert len(seen) < sum(len(row.hash_ids) for row in rows)  # some are shared


def test_a_turn_starts_with_the_previous_turns_full_blocks() -> None:
    planned = plan(RICH, window=60.0)
    ids = hashids.assign(planned, hashids.arrival_order(planned.requests))
    turns = [(i, r) for i, r in enumerate(planned.requests) if r.parent is not None]
    assert turns
    for i, request in turns:
        parent = planned.requests[request.parent]
        full = hashids.full_blocks(parent.input_length)
        assert ids[i][:full] == ids[request.parent][:full]
        assert ids[i][full:] and not set(ids[i][full:]) & set(ids[request.parent])
        assert request.input_length > parent.input_length + parent.output_length
        assert len(ids[i]) == hashids.num_blocks(request.input_length)


def test_lengths_stay_within_their_limits() -> None:
    rows = build(RICH)
    assert max(row.input_length for row in rows) <= RICH.input_max
    assert max(row.output_length for row in rows) <= RICH.output_max


def test_rate_and_burstiness_are_as_asked() -> None:
    stats = trace_stats(build(GenParams(requests=3000, rate=4.0, burstiness=0.25)))
    assert stats.rate == pytest.approx(4.0, rel=0.05)
    assert stats.interarrival_cv == pytest.approx(2.0, abs=0.2)
    with_sessions = trace_stats(build(replace(RICH, requests=2000)))
    assert with_sessions.rate == pytest.approx(RICH.rate, rel=0.1)


def test_duration_keeps_the_arrivals_before_it() -> None:
    rows = build(GenParams(duration=100.0, rate=10.0))
    assert rows[-1].timestamp < 100.0
    assert len(rows) == pytest.approx(1000, rel=0.1)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_each_preset_meets_its_target_reuse(name: str) -> None:
    params = PRESETS[name].params
    tuned = generate(params)
    stats = trace_stats(tuned.rows)
    assert stats.requests == 3000
    assert stats.reuse_ceiling == pytest.approx(params.target_reuse or 0.0, abs=0.05)
    assert stats.rate == pytest.approx(params.rate, rel=0.1)


def test_an_explicit_knob_drops_the_presets_target() -> None:
    args = build_parser().parse_args(["trace", "gen", "-o", "x", "--preset", "tool-agent"])
    assert gen_params(args).target_reuse == PRESETS["tool-agent"].params.target_reuse
    args = build_parser().parse_args(
        ["trace", "gen", "-o", "x", "--preset", "tool-agent", "--system-tokens", "900"]
    )
    assert (gen_params(args).target_reuse, gen_params(args).system_tokens) == (None, 900)


def test_the_summary_reports_achieved_and_target_reuse(tmp_path: Path, capsys) -> None:
    path = tmp_path / "t.jsonl"
    flags = ["--requests", "300", "--session-share", "0.3", "--target-reuse", "0.3"]
    assert main(["trace", "gen", "-o", str(path), *flags]) == 0
    err = capsys.readouterr().err
    assert "wrote 300 requests" in err and "(target 0.3, --session-share" in err


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--rate", "-1"], "--rate must be a positive number"),
        (["--session-share", "1.5"], "--session-share must be in [0, 1)"),
        (["--system-prompts", "2", "--system-tokens", "0"], "--system-tokens must be in"),
        (["--tune", "rate"], "--tune must be one of"),
    ],
)
def test_bad_parameters_are_usage_errors(tmp_path: Path, capsys, flags, message) -> None:
    assert main(["trace", "gen", "-o", str(tmp_path / "t.jsonl"), *flags]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "t.jsonl").exists()
