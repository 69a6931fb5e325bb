"""How a prefill ends once its KV streams are done."""

from shared.prefill.outcome import (
    finish_at_first_token,
    kv_is_whole,
    refused_code,
    streams_verdict,
)


def test_only_a_computed_and_sent_prompt_is_whole():
    assert kv_is_whole("length", sent=True)
    assert not kv_is_whole("length", sent=False)
    assert not kv_is_whole("abort", sent=True) and not kv_is_whole("error", sent=True)


def test_the_first_token_ends_a_request_on_a_stop_token_or_when_one_was_asked():
    assert finish_at_first_token(stopped=True, max_tokens=10) == "stop"
    assert finish_at_first_token(stopped=False, max_tokens=1) == "length"
    assert finish_at_first_token(stopped=False, max_tokens=2) is None


def test_a_refusal_without_a_code_is_retried_elsewhere():
    assert refused_code(200) == 503 and refused_code(400) == 400


def test_streams_agree_or_the_first_error_wins():
    assert streams_verdict([(True, 8, ""), (True, 8, "")]) == (True, 8, "")
    ok, _, error = streams_verdict([(True, 8, ""), (False, 3, "reset"), (False, 1, "late")])
    assert not ok and error == "reset"


def test_streams_that_sent_different_frame_counts_fail():
    ok, _, error = streams_verdict([(True, 8, ""), (True, 7, "")])
    assert not ok and "different frame counts [7, 8]" in error
