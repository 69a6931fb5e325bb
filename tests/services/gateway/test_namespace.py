"""The gateway names KV blocks as the workers' engines do, for each way of holding weights."""

from __future__ import annotations

from services.gateway.service import GatewayConfig, GatewayService
from shared.engine.config import EngineConfig
from shared.engine.namespace import kv_namespace
from shared.model.registry import resolve_model


def test_the_gateway_names_kv_blocks_as_the_engine_does_and_each_weight_format_apart() -> None:
    names = set()
    for weights, activations in (
        ("auto", "float"),
        ("auto", "q8"),
        ("auto", "q16"),
        ("q8_0", "float"),
    ):
        engine = EngineConfig(weights=weights, activations=activations)
        mine = kv_namespace(resolve_model(engine.model), engine.resolved_dtype, engine.kv_weights)
        gateway = GatewayService(
            GatewayConfig(http_port=0, weights=weights, activations=activations)
        )
        assert gateway.namespace == mine
        names.add(mine)
    floats = EngineConfig(weights="float", dtype="float32")
    names.add(kv_namespace(resolve_model(floats.model), "float32", floats.kv_weights))
    assert len(names) == 5  # a Q4_1 model's KV is never served to a float one
