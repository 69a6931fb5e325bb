"""Which cost model a conductor predicts with when none is named (`--cost-model auto`)."""

from __future__ import annotations

import pytest

from services.cli.service import conductor_cost_model, cpu_roofline
from shared.costmodel import MODELS
from shared.errors import KvstackError


def test_without_a_profile_the_roofline_has_the_served_models_shape(tiny_llama_dir) -> None:
    cost = cpu_roofline(str(tiny_llama_dir))
    assert (cost.shape.num_layers, cost.shape.hidden_size) == (2, 64)
    assert cost.hardware.name.startswith("cpu")


def test_an_unreachable_model_falls_back_to_smollm2s_shape() -> None:
    assert cpu_roofline("/no/such/model").shape == MODELS["smollm2-135m"]


def test_a_named_spec_is_used_and_a_bad_one_is_a_clear_error(tmp_path) -> None:
    assert conductor_cost_model("roofline:llama3-70b:h100", "x").hardware.name == "8xH100"
    with pytest.raises(KvstackError, match="profile"):
        conductor_cost_model(str(tmp_path / "missing.json"), "x")
