"""Whether a decode worker reserves blocks for a request's KV."""

from shared.decode.admission import (
    ADMISSION_HEADROOM_TOKENS,
    KV_FULL,
    LAYOUT_MISMATCH,
    REFORMING,
    attention_refusal,
    reattach_needed,
    reservation_refusal,
    reservation_size,
    reusable_blocks,
)


def test_a_healthy_worker_takes_a_valid_prompt():
    assert reservation_refusal(False, False, True, "") is None


def test_refusals_come_in_order_draining_reforming_layout_prompt():
    draining = reservation_refusal(True, True, False, "bad token")
    assert draining is not None and (draining.label, draining.code) == ("draining", 503)
    assert reservation_refusal(False, True, False, "bad token") is REFORMING
    assert reservation_refusal(False, False, False, "bad token") is LAYOUT_MISMATCH
    invalid = reservation_refusal(False, False, True, "bad token")
    assert invalid is not None and (invalid.label, invalid.reason, invalid.code) == (
        "invalid",
        "bad token",
        400,
    )


def test_a_layout_mismatch_is_a_deployment_error_and_a_full_cache_passes():
    assert LAYOUT_MISMATCH.code == 500 and KV_FULL.code == 503


def test_the_reservation_holds_the_prompt_and_first_token_with_capped_headroom():
    assert reservation_size(100, max_tokens=10) == (101, 10)
    assert reservation_size(100, max_tokens=10_000) == (101, ADMISSION_HEADROOM_TOKENS)


def test_a_lost_shard_re_forms_the_group_once():
    assert attention_refusal("attention worker a0: gone").label == "attention"
    assert reattach_needed("attention worker a0 stopped", reattaching=False)
    assert not reattach_needed("attention worker a0 stopped", reattaching=True)
    assert not reattach_needed("", reattaching=False)


def test_the_held_prefix_stops_before_the_block_of_the_last_token():
    # NOTE: some KV must arrive in every layer: the last token's always does
    assert reusable_blocks(32, 16, offloaded=False) == 1
    assert reusable_blocks(33, 16, offloaded=False) == 2
    assert reusable_blocks(16, 16, offloaded=False) == 0
    assert reusable_blocks(1000, 16, offloaded=True) == 0  # the KV is on attention workers
