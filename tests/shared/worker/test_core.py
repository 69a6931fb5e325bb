"""Decisions prefill and decode workers share."""

from shared.engine.output import ENGINE_ERROR, REQUEST_ERROR
from shared.engine.stats import EngineStats
from shared.worker.core import error_code, intake_refusal, load_heartbeat


def test_a_draining_worker_refuses_first_then_an_invalid_prompt():
    draining = intake_refusal(True, "empty prompt", "prefill")
    assert draining is not None and draining.reason == "prefill worker is draining"
    assert draining.code == 503
    invalid = intake_refusal(False, "empty prompt", "prefill")
    assert invalid is not None and (invalid.reason, invalid.code) == ("empty prompt", 400)
    assert intake_refusal(False, "", "prefill") is None


def test_only_a_requests_own_fault_is_final():
    assert error_code(REQUEST_ERROR) == 500 and error_code(ENGINE_ERROR) == 503


def test_a_heartbeat_carries_the_load_numbers():
    load = EngineStats(2, 3, 40, 500, 7, 9)
    hb = load_heartbeat("decode", "d0", 12.5, 1.0, 16, load, model="m", draining=True)
    assert (hb.service, hb.worker_id, hb.time, hb.interval, hb.block_size) == (
        "decode",
        "d0",
        12.5,
        1.0,
        16,
    )
    assert (hb.num_running, hb.num_waiting, hb.queued_tokens, hb.context_tokens) == (2, 3, 40, 500)
    assert (hb.free_blocks, hb.total_blocks, hb.model, hb.draining) == (7, 9, "m", True)
