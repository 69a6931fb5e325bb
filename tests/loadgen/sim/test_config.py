import pytest

from loadgen.sim.config import EVENT_INTERVAL, HEARTBEAT_INTERVAL, SimConfig, node_kv_tokens
from shared.conductor.config import SchedulingConfig
from shared.costmodel import MODELS
from shared.errors import KvstackError


def test_reports_as_often_as_live_workers():
    from services.prefill.sharing import EVENT_INTERVAL as LIVE_EVENTS
    from shared.runtime.service import ServiceConfig

    assert ServiceConfig().heartbeat_interval == HEARTBEAT_INTERVAL
    assert EVENT_INTERVAL == LIVE_EVENTS


@pytest.mark.parametrize(
    "nodes, policy, admission, message",
    [
        ((2, 2, 2), "kvcentric", "none", "either"),
        ((0, 0, 0), "kvcentric", "none", "either"),
        ((2, 0, 0), "kvcentric", "none", "at least one"),
        ((0, 0, 2), "kvcentric", "none", "no KV pool"),
        ((0, 0, 2), "load-balance", "early", "without admission"),
    ],
)
def test_bad_clusters_are_refused(nodes, policy, admission, message):
    with pytest.raises(KvstackError, match=message):
        SimConfig(1000, *nodes, SchedulingConfig(policy, admission))


def test_a_node_holds_its_hbm_less_the_weights_in_kv():
    shape = MODELS["llama3-70b"]
    free = 8 * 80e9 * 0.9 - shape.weight_bytes
    assert (
        node_kv_tokens("llama3-70b", "a800") == int(free // (shape.kv_bytes_per_token * 512)) * 512
    )
    with pytest.raises(KvstackError, match="--kv-tokens"):
        node_kv_tokens("llama3-70b", "cpu")
