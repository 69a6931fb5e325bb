"""Whether a decode worker adopts a request whose KV arrived."""

from shared.decode.commit import (
    ADOPT,
    commit_verdict,
    current_tbt,
    holds_kv_for_pool,
    over_tbt_slo,
)


def test_an_idle_worker_gives_no_tbt():
    assert current_tbt(0.05, busy=False) == 0.0 and current_tbt(0.05, busy=True) == 0.05


def test_the_tbt_check_passes_within_the_slo_or_without_one():
    assert over_tbt_slo(0.05, 0.1) == "" and over_tbt_slo(0.1, 0.1) == ""
    assert over_tbt_slo(5.0, 0.0) == ""
    assert "decode TBT 150ms exceeds the SLO 100ms (prefill wasted)" in over_tbt_slo(0.15, 0.1)


def test_kv_that_did_not_land_intact_is_refused_before_the_tbt_is_looked_at():
    verdict = commit_verdict("frame 3 missing", tbt=5.0, stage_tbt_slo=0.1)
    assert not verdict.adopt and verdict.transfer_failed and not verdict.wasted
    assert verdict.ack("r").error == "KV transfer failed: frame 3 missing"
    assert verdict.ack("r").code == 503


def test_over_the_stage_slo_the_prefill_is_wasted():
    verdict = commit_verdict("", tbt=0.2, stage_tbt_slo=0.1)
    assert not verdict.adopt and verdict.wasted and not verdict.transfer_failed
    assert "prefill wasted" in verdict.ack("r").error


def test_otherwise_the_request_is_adopted():
    assert commit_verdict("", tbt=0.05, stage_tbt_slo=0.1) is ADOPT
    ack = ADOPT.ack("r")
    assert (ack.ok, ack.code, ack.error) == (True, 200, "")


def test_kv_is_held_past_the_end_only_for_a_pool_with_members():
    assert holds_kv_for_pool(2) and not holds_kv_for_pool(0)
