"""Every message survives the wire; anything malformed is one clear MessageError."""

from __future__ import annotations

import pytest

from shared import codec
from shared.logprob import TokenLogprob
from shared.messages import (
    Abort,
    Ack,
    Heartbeat,
    KVCommit,
    KVReservation,
    KVReserve,
    Placement,
    PlacementRequest,
    PrefillRequest,
    StatsRequest,
    TokenEvent,
    WorkerStats,
)
from shared.sampling_params import SamplingParams

PARAMS = SamplingParams(max_tokens=5, temperature=0.5, stop=("x", "y"), seed=3, logprobs=2)
LOGPROB = TokenLogprob(7, -0.25, ((7, -0.25), (9, -1.5)))
EXAMPLES = [
    Heartbeat("decode", "d0", 1.5, 1.0, data_addr="127.0.0.1:1", free_blocks=3),
    PlacementRequest("r", 10, 5, 2.0, block_hashes=(2**64 - 1, 5), exclude=("p0",)),
    Placement("r", True, "p0", "d0"),
    PrefillRequest("r", (1, 2, 3), PARAMS, "d0", 9.0),
    Ack("r", False, "nope", 503),
    KVReserve("r", (1, 2), PARAMS, 16, "ns", 3.0, "p0"),
    KVReservation("r", True, (4, 5), "127.0.0.1:9"),
    KVCommit("r", True, 30, 7, LOGPROB, 16),
    TokenEvent("r", 2, (7,), (LOGPROB,), True, "length", 3, 0),
    Abort("r", "client gone"),
    StatsRequest(),
    WorkerStats("d0", 1, 0, 10, 20, 1, 2, 3),
]


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip(message) -> None:
    assert codec.decode(codec.encode(message)) == message
    assert codec.decode(codec.encode(message), type(message)) == message


BAD = {
    b"not json": "not valid JSON",
    b"[1, 2]": "lacks a 'kind'",
    b'{"kind": "launch_rockets", "body": {}}': "unknown message kind",
    b'{"kind": "abort", "body": {"request_id": 5}}': "expected str",
    b'{"kind": "abort", "body": {}}': "missing field 'request_id'",
    b'{"kind": "abort", "body": {"request_id": "r", "extra": 1}}': "unknown field",
    b'{"kind": "prefill_request", "body": {"request_id": "r", "prompt_token_ids": [1, "2"], '
    b'"params": {}, "decode_id": "d", "deadline": 1}}': "prompt_token_ids[1]",
    b'{"kind": "prefill_request", "body": {"request_id": "r", "prompt_token_ids": [1], '
    b'"params": {"top_p": 7}, "decode_id": "d", "deadline": 1}}': "top_p",
}


@pytest.mark.parametrize("data,fragment", BAD.items())
def test_bad_messages_are_one_clear_error(data: bytes, fragment: str) -> None:
    with pytest.raises(codec.MessageError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        codec.decode(data)


def test_a_message_of_the_wrong_kind_is_refused() -> None:
    with pytest.raises(codec.MessageError, match="expected ack"):
        codec.decode(codec.encode(Abort("r")), Ack)
