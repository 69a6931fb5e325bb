"""Lamina's equal-cost estimate: the capacity and traffic arithmetic of the paper, flagged
infeasible batches, and the shape of the curves the physics allows."""

from __future__ import annotations

import itertools
import json
import sys

import pytest

from shared.costmodel.offload import (
    SHAPES,
    Assumptions,
    Pool,
    Scenario,
    equal_cost_rows,
    homogeneous_max_batch,
    kv_bytes_per_request,
    lamina_max_batch,
    lamina_step_time,
    main,
    max_batch,
    plot,
    render_summary,
    render_table,
    scenario_rows,
    summary,
    wire_bytes_per_token_per_layer,
)
from shared.errors import KvstackError

LLAMA3_70B, LLAMA_65B = SHAPES["llama3-70b"], SHAPES["llama-65b"]
DEFAULTS = Assumptions()


@pytest.fixture
def long_context() -> Scenario:
    return Scenario(LLAMA3_70B, 8192)


def test_one_h100_holds_about_30_requests_of_8k_llama3_70b_kv_before_weights() -> None:
    request = kv_bytes_per_request(LLAMA3_70B, 8192)
    assert request == 320 * 1024 * 8192  # 320 KiB of KV per token
    assert max_batch(80e9, 0, request) == 29  # the paper's "about 30" (80 GB / 2.68 GB)
    assert max_batch(80e9, 79e9, request) == 0  # no room left beside weights
    assert max_batch(80e9, 90e9, request) == 0  # weights that do not fit leave none, not < 0


def test_capacity_of_each_system_at_equal_cost(long_context) -> None:
    request = 327_680 * 8192
    # 4 x 80 GB at 90%, minus the weights, against 4 x 96 GB at 90% for the KV alone.
    assert (
        homogeneous_max_batch(long_context, DEFAULTS)
        == (288e9 - LLAMA3_70B.weight_bytes) // request
    )
    assert lamina_max_batch(long_context, DEFAULTS) == 345.6e9 // request


@pytest.mark.parametrize("model", ["llama3-70b", "llama-65b"])
@pytest.mark.parametrize("context", [2048, 4096, 8192])
def test_lamina_batches_about_2_4x_more_at_equal_cost(model, context) -> None:
    """The paper's main effect: batch 2.39x vLLM's on average (v2 §6)."""
    scenario = Scenario(SHAPES[model], context)
    ratio = lamina_max_batch(scenario, DEFAULTS) / homogeneous_max_batch(scenario, DEFAULTS)
    assert 2.0 < ratio < 2.7


def test_llama3_70b_reaches_about_800_requests_at_azure_conv_lengths() -> None:
    """Paper: batch ~800 at DOP(2,4). Azure-Conv averages 1154.7 prompt + 211.1 generated
    tokens, so a decoding request holds about 1154.7 + 211.1 / 2 tokens of KV."""
    scenario = Scenario(LLAMA3_70B, round(1154.7 + 211.1 / 2))
    assert 700 < lamina_max_batch(scenario, DEFAULTS) < 900


def test_wire_bytes_per_token_per_layer_follow_the_papers_formula() -> None:
    assert wire_bytes_per_token_per_layer(LLAMA3_70B) == (20_480, 16_384)
    assert sum(wire_bytes_per_token_per_layer(LLAMA_65B)) == 65_536  # MHA: (2 + 2/G) d e
    assert sum(wire_bytes_per_token_per_layer(LLAMA3_70B)) * 80 == pytest.approx(2.95e6, 1e-3)


def test_pools_cost_what_the_paper_says() -> None:
    h100, h20 = Pool("h100", 1).hardware, Pool("h20", 1).hardware
    assert (h100.price_per_hour, h20.price_per_hour) == pytest.approx((11.06, 4.63))
    assert h100.flops == pytest.approx(989e12) and h20.mem_bw == pytest.approx(4e12)
    row = scenario_rows(Scenario(LLAMA3_70B, 8192), batches=[1])[0]
    assert row["lamina_price"] == pytest.approx(40.64)
    assert row["homogeneous_price"] == pytest.approx(44.24)


def test_infeasible_batches_are_flagged_not_computed(long_context) -> None:
    rows = scenario_rows(long_context)
    homo_max = homogeneous_max_batch(long_context, DEFAULTS)
    too_big = [r for r in rows if r["batch"] > homo_max]
    assert too_big and all(not r["homogeneous_feasible"] for r in too_big)
    assert all(r["homogeneous_tokens_per_s"] is None and r["ratio"] is None for r in too_big)
    last = rows[-1]
    assert last["batch"] == 1024 and not last["lamina_feasible"]
    assert last["lamina_per_dollar"] is None and last["lamina_serial_tokens_per_s"] is None
    assert "| 1,024 | OOM | OOM | OOM | OOM | OOM | n/a |" in render_table(rows)


def test_each_systems_largest_batch_gets_a_row(long_context) -> None:
    rows = scenario_rows(long_context, batches=[1])
    assert [r["batch"] for r in rows] == [
        1,
        homogeneous_max_batch(long_context, DEFAULTS),
        lamina_max_batch(long_context, DEFAULTS),
    ]
    assert rows[1]["homogeneous_max"] and rows[2]["lamina_max"]
    assert rows[1]["homogeneous_feasible"] and not rows[2]["homogeneous_feasible"]


def test_lamina_needs_the_weights_to_fit_its_model_workers() -> None:
    scenario = Scenario(LLAMA3_70B, 8192, model_workers=Pool("h100", 1))  # 140 GB on 80 GB
    assert lamina_max_batch(scenario, DEFAULTS) == 0
    assert not any(r["lamina_feasible"] for r in scenario_rows(scenario))


def test_attention_workers_must_split_the_kv_heads_evenly() -> None:
    with pytest.raises(KvstackError, match="cannot split 8 KV heads"):
        Scenario(LLAMA3_70B, 8192, attention_workers=Pool("h20", 3))


@pytest.mark.parametrize("system", ["homogeneous", "lamina_pipelined", "lamina_serial"])
def test_throughput_grows_with_batch_while_it_fits(system) -> None:
    """Every step pays fixed costs (weights, overhead, latency) that a larger batch shares."""
    rows = scenario_rows(Scenario(LLAMA3_70B, 4096), batches=range(1, 300, 7))
    rates = [r[f"{system}_tokens_per_s"] for r in rows if r[f"{system}_tokens_per_s"]]
    assert len(rates) > 10 and all(a < b for a, b in itertools.pairwise(rates))


def test_at_the_same_batch_lamina_is_slower_its_gain_is_the_batch(long_context) -> None:
    """Half as many H100s read the same weights, and the network adds to every layer."""
    both = [r for r in scenario_rows(long_context) if r["ratio"] is not None]
    assert both and all(r["lamina_tokens_per_s"] < r["homogeneous_tokens_per_s"] for r in both)
    info = summary(scenario_rows(long_context))
    assert info["best_ratio"] > 1.0
    assert info["lamina"]["best_batch"] > info["homogeneous"]["best_batch"]


def test_ping_pong_costs_a_second_weight_read_and_pays_when_attention_is_big(long_context) -> None:
    one = [lamina_step_time(long_context, 1, DEFAULTS, p) for p in (True, False)]
    model = long_context.model_workers.hardware
    weights_read = LLAMA3_70B.weight_bytes / (model.mem_bw * model.bw_efficiency)
    # Two micro-batches of half a request each: two weight reads hide the round trips.
    assert one[0] == pytest.approx(model.step_overhead + 2 * weights_read, rel=0.01)
    assert one[0] > 1.5 * one[1]
    # At full KV capacity attention takes about as long as the dense part: overlap wins.
    full = lamina_max_batch(long_context, DEFAULTS)
    assert lamina_step_time(long_context, full, DEFAULTS, True) < 0.9 * lamina_step_time(
        long_context, full, DEFAULTS, False
    )


def test_without_overlap_every_layer_pays_one_round_trip(long_context) -> None:
    slow = Assumptions(network_rtt=66.6e-6)  # NCCL's instead of FHBN's 33 us
    delta = lamina_step_time(long_context, 64, slow, False) - lamina_step_time(
        long_context, 64, DEFAULTS, False
    )
    assert delta == pytest.approx(80 * 33.6e-6)


@pytest.mark.parametrize("schedule", ["best", "pipelined", "serial"])
def test_the_schedule_picks_which_lamina_figure_prices(schedule) -> None:
    rows = scenario_rows(Scenario(LLAMA3_70B, 8192), assumptions=Assumptions(schedule=schedule))
    for r in (r for r in rows if r["lamina_feasible"]):
        both = r["lamina_pipelined_tokens_per_s"], r["lamina_serial_tokens_per_s"]
        expected = max(both) if schedule == "best" else both[schedule == "serial"]
        assert r["lamina_tokens_per_s"] == expected
        assert r["lamina_per_dollar"] == pytest.approx(expected / 40.64)


def test_an_unknown_schedule_is_refused() -> None:
    with pytest.raises(KvstackError, match="unknown schedule 'overlap'"):
        Assumptions(schedule="overlap")


def test_longer_contexts_halve_the_batch() -> None:
    short, long = Scenario(LLAMA3_70B, 4096), Scenario(LLAMA3_70B, 8192)
    for capacity in (homogeneous_max_batch, lamina_max_batch):
        assert capacity(short, DEFAULTS) >= 2 * capacity(long, DEFAULTS)
        assert capacity(short, DEFAULTS) <= 2 * capacity(long, DEFAULTS) + 1


def test_default_rows_cover_both_models_at_8k_and_4k() -> None:
    rows = equal_cost_rows()
    scenarios = {(r["model"], r["context"]) for r in rows}
    assert scenarios == {(m, c) for m in ("llama3-70b", "llama-65b") for c in (8192, 4096)}
    assert render_table(rows).count("| batch |") == 4
    assert render_summary(rows).count("\n") == 2 + 4


def test_main_prints_the_table_or_json(capsys) -> None:
    main([])
    assert capsys.readouterr().out.startswith("**llama3-70b, context 8,192**: DOP(2,4)")
    main(["--json", "--context", "2048"])
    rows = json.loads(capsys.readouterr().out)
    assert {r["context"] for r in rows} == {2048} and len(rows) > 9


def test_plot_without_matplotlib_says_how_to_get_it(monkeypatch, tmp_path) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes the import fail
    with pytest.raises(KvstackError, match=r"pip install .kvstack\[bench\]."):
        plot(equal_cost_rows(), tmp_path / "x.png")


def test_plot_writes_a_png(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    path = plot(equal_cost_rows(), tmp_path / "lamina.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 10_000
