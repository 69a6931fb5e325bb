"""Naming a cost model: a profile's path or roofline:<model>:<hardware>."""

from __future__ import annotations

import pytest

from shared import costmodel
from shared.costmodel import FittedCostModel, RooflineCostModel
from shared.errors import KvstackError


def test_a_roofline_spec_names_a_model_shape_and_hardware() -> None:
    cost = costmodel.from_spec("roofline:llama3-70b:a800")
    assert isinstance(cost, RooflineCostModel)
    assert cost.shape.name == "llama3-70b" and cost.hardware.name == "8xA800"
    assert cost.kv_bytes_per_token == 327_680


def test_a_path_spec_loads_a_profile(tmp_path) -> None:
    profile = FittedCostModel("m", (0.01, 1e-3, 0, 0, 0), (0.01, 1e-3, 0), 1e9, 1e-3, 100)
    profile.save(path := tmp_path / "m.json")
    assert costmodel.from_spec(str(path)) == profile == costmodel.load(path)


@pytest.mark.parametrize(
    "spec,fragment",
    [
        ("", "no cost model given"),
        ("roofline:llama3-70b", "expected roofline:<model>:<hardware>"),
        ("roofline:llama3-70b:a800:x", "expected roofline:<model>:<hardware>"),
        ("roofline:gpt-5:a800", "unknown model shape 'gpt-5'; known: llama3-70b"),
        ("roofline:llama3-70b:tpu", "unknown hardware 'tpu'; known: a800"),
        ("/nonexistent/profile.json", "no cost model at /nonexistent/profile.json"),
    ],
)
def test_bad_specs_fail_with_a_clear_error(spec, fragment) -> None:
    with pytest.raises(KvstackError, match=fragment.replace("(", r"\(")):
        costmodel.from_spec(spec)


@pytest.mark.parametrize("spec", ["roofline:smollm2-135m:cpu", "roofline:qwen2-7b:h20"])
def test_every_cost_model_answers_the_conductors_questions(spec) -> None:
    cost = costmodel.from_spec(spec)
    assert cost.prefill_time(100, 0) > 0 and cost.prefill_time(100, 900) > 0
    assert cost.decode_step_time(4, 4000) > 0 and cost.transfer_time(1e6) > 0
    assert cost.kv_bytes_per_token > 0
