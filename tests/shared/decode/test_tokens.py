"""Token events of the requests a decode worker adopted."""

from shared.decode.tokens import TokenSequencer
from shared.engine.output import ENGINE_ERROR, REQUEST_ERROR, RequestOutput


def output(
    rid: str = "r",
    tokens: tuple[int, ...] = (7,),
    finish_reason: str | None = None,
    stop_reason: str | None = None,
    error_kind: str = "",
) -> RequestOutput:
    return RequestOutput(
        rid,
        tokens,
        "",
        None,
        finish_reason is not None,
        finish_reason,
        stop_reason,
        num_prompt_tokens=10,
        num_cached_tokens=4,
        num_output_tokens=len(tokens),
        error_kind=error_kind,
    )


def test_events_follow_the_prefill_workers_first_token():
    seq = TokenSequencer()
    seq.adopt("r")
    first, second = seq.event(output()), seq.event(output(tokens=(8, 9)))
    assert first is not None and second is not None
    assert (first.seq, second.seq, second.token_ids) == (1, 2, (8, 9))
    assert (first.num_prompt_tokens, first.num_cached_tokens) == (10, 4)


def test_a_request_not_adopted_here_gets_no_event():
    assert TokenSequencer().event(output()) is None


def test_the_last_event_ends_the_request_here():
    seq = TokenSequencer()
    seq.adopt("r")
    last = seq.event(output(finish_reason="length"))
    assert last is not None and last.finished and last.code == 200
    assert "r" not in seq and len(seq) == 0 and seq.event(output()) is None


def test_an_engine_error_is_retried_elsewhere_and_a_request_error_is_not():
    seq = TokenSequencer()
    seq.adopt("a")
    seq.adopt("b")
    engine = seq.event(output("a", (), "error", "CUDA lost", ENGINE_ERROR))
    own = seq.event(output("b", (), "error", "bad logits", REQUEST_ERROR))
    assert engine is not None and (engine.error, engine.code) == ("CUDA lost", 503)
    assert own is not None and (own.error, own.code) == ("bad logits", 500)


def test_a_handed_back_request_ends_with_a_retryable_error_and_nothing_after():
    seq = TokenSequencer()
    seq.adopt("r")
    seq.event(output())
    back = seq.hand_back("r", "stopping")
    assert back is not None and (back.seq, back.finished, back.code) == (2, True, 503)
    assert seq.hand_back("r", "stopping") is None and seq.event(output()) is None


def test_an_abort_drops_only_a_decoding_request():
    seq = TokenSequencer()
    seq.adopt("r")
    assert seq.drop("r") and not seq.drop("r") and seq.request_ids() == []
