"""TextStream: token ids in, visible text out; stop strings never shown, counts kept right."""

from __future__ import annotations

import pytest

from services.gateway.text import TextStream
from shared.logprob import TokenLogprob
from shared.model.tokenizer import Tokenizer
from shared.sampling_params import SamplingParams

PROMPT = (1, 4093, 198)


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir) -> Tokenizer:
    return Tokenizer.from_dir(smollm2_dir)


def one_by_one(stream: TextStream, ids: list[int]) -> list[str]:
    return [stream.push([token_id]).text for token_id in ids]


def test_text_matches_a_plain_decode(tokenizer) -> None:
    ids = tokenizer.encode("The quick brown fox, naïve café 🙂 — done.")
    stream = TextStream(tokenizer, PROMPT, SamplingParams())
    pieces = one_by_one(stream, ids)
    assert "".join(pieces) + stream.finish() == tokenizer.decode(ids) == stream.text
    assert stream.num_tokens == len(ids) and not stream.stopped


def test_a_character_split_over_tokens_arrives_whole(tokenizer) -> None:
    ids = tokenizer.encode("x🦜y")  # the parrot is three byte-level tokens
    assert len(ids) == 5
    pieces = one_by_one(TextStream(tokenizer, PROMPT, SamplingParams()), ids)
    assert pieces == ["x", "", "", "🦜", "y"]


def test_stop_string_split_across_tokens_is_never_shown(tokenizer) -> None:
    ids = tokenizer.encode("The answer is: STOP here and more")
    stream = TextStream(tokenizer, PROMPT, SamplingParams(stop=("STOP",)))
    updates = [stream.push([token_id]) for token_id in ids]
    shown = "".join(update.text for update in updates) + stream.finish()
    assert shown == "The answer is: " and "ST" not in shown
    # " ST" and "OP" complete the stop string at the 6th token: counted, later ones dropped.
    later = len(ids) - 6
    assert [update.stopped for update in updates] == [False] * 5 + [True] * (1 + later)
    assert stream.num_tokens == 6
    assert [len(update.token_ids) for update in updates] == [1] * 6 + [0] * later


def test_stop_inside_one_push_drops_the_tokens_after_it(tokenizer) -> None:
    ids = tokenizer.encode("one\n\nUser: two")
    logprobs = [TokenLogprob(token_id, -0.1 * i) for i, token_id in enumerate(ids)]
    stream = TextStream(tokenizer, PROMPT, SamplingParams(stop=("\n\n", "User:")))
    update = stream.push(ids, logprobs)
    assert update.text == "one" and update.stopped
    assert update.token_ids == tuple(ids[:3]) and update.logprobs == tuple(logprobs[:3])
    assert stream.num_tokens == 3 and stream.finish() == ""
    later = stream.push([42], [TokenLogprob(42, -1.0)])
    assert later.empty and later.stopped and stream.num_tokens == 3


def test_held_back_text_is_flushed_at_the_end(tokenizer) -> None:
    ids = tokenizer.encode("wait for it S")
    stream = TextStream(tokenizer, PROMPT, SamplingParams(stop=("STOP",)))
    shown = "".join(one_by_one(stream, ids))
    assert shown == "wait for i"  # "t S" could still start "STOP"
    assert stream.finish() == "t S" and stream.text == "wait for it S"


def test_text_offset_counts_the_text_shown_before(tokenizer) -> None:
    stream = TextStream(tokenizer, PROMPT, SamplingParams())
    ids = tokenizer.encode("Hello big world")
    offsets = [stream.push([token_id]).text_offset for token_id in ids]
    assert offsets == [len(tokenizer.decode(ids[:i])) for i in range(len(ids))] == [0, 5, 9]


def test_eos_and_stop_token_ids_add_no_text(tokenizer) -> None:
    params = SamplingParams(stop_token_ids=(4093,), skip_special_tokens=False)
    stream = TextStream(tokenizer, PROMPT, params)
    ids = [*tokenizer.encode("Hi"), 4093, tokenizer.eos_token_id]
    assert "".join(one_by_one(stream, ids)) == "Hi" and stream.num_tokens == len(ids)


def test_eos_text_shows_when_eos_is_ignored_and_specials_are_kept(tokenizer) -> None:
    params = SamplingParams(ignore_eos=True, skip_special_tokens=False)
    stream = TextStream(tokenizer, PROMPT, params)
    assert stream.push([tokenizer.eos_token_id]).text == "<|im_end|>"


def test_without_a_tokenizer_only_ids_flow() -> None:
    stream = TextStream(None, PROMPT, SamplingParams())
    logprobs = (TokenLogprob(5, -0.5), TokenLogprob(6, -0.25))
    update = stream.push([5, 6], logprobs)
    assert update.text == "" and update.token_ids == (5, 6) and update.logprobs == logprobs
    assert not update.empty and stream.num_tokens == 2 and stream.finish() == ""
