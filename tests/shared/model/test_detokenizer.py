"""Streaming detokenization: deltas add up to the full decode and never split a character."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from shared.model.detokenizer import IncrementalDetokenizer
from shared.model.tokenizer import Tokenizer

TEXTS = [
    "Plain ASCII text, with punctuation!",
    "Emoji: 😀🎉 family 👩‍👩‍👧 flag 🇫🇷 done",
    "CJK: 中文字符和日本語のテキスト、한국어",
    "Accents: naïve café, Ünïcödé, crème brûlée, Ångström",
    "Lines\n\nwith\ttabs\n  and indentation\r\n",
    "Mixed 12345 + 3.14 = ∑∫√ → ∞",
]


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(smollm2_dir)


def stream(detokenizer: IncrementalDetokenizer, ids: list[int]) -> list[str]:
    return [detokenizer.step(token_id) for token_id in ids]


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_concatenate_to_full_decode(tokenizer: Tokenizer, text: str) -> None:
    prompt = tokenizer.encode_chat([{"role": "user", "content": "Say something."}])
    ids = tokenizer.encode(text, add_special_tokens=False)
    detokenizer = IncrementalDetokenizer(tokenizer, prompt)
    deltas = stream(detokenizer, ids)
    assert "".join(deltas) == detokenizer.text == tokenizer.decode(ids) == text
    assert not any("\ufffd" in delta for delta in deltas)


def test_split_characters_are_held_back(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("🎉", add_special_tokens=False)
    assert len(ids) > 1  # byte-level: the emoji spans several tokens
    deltas = stream(IncrementalDetokenizer(tokenizer, []), ids)
    assert deltas == [""] * (len(ids) - 1) + ["🎉"]


def test_special_tokens_skipped_or_kept(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("Hi<|im_end|> there", add_special_tokens=False)
    assert "".join(stream(IncrementalDetokenizer(tokenizer, [1]), ids)) == "Hi there"
    kept = IncrementalDetokenizer(tokenizer, [1], skip_special_tokens=False)
    assert "".join(stream(kept, ids)) == "Hi<|im_end|> there"


@pytest.fixture(scope="module")
def sentencepiece_style(tmp_path_factory) -> Tokenizer:
    """A Metaspace tokenizer, whose decoder drops the space before the first word it sees."""
    backend = BackendTokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    corpus = ["hello world, the world is wide", "hello there world"] * 20
    backend.train_from_iterator(
        corpus, trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "</s>"])
    )
    model_dir = tmp_path_factory.mktemp("sp")
    backend.save(str(model_dir / "tokenizer.json"))
    (model_dir / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    return Tokenizer.from_dir(model_dir)


def test_prompt_context_keeps_leading_space(sentencepiece_style: Tokenizer) -> None:
    ids = sentencepiece_style.encode("hello world is wide")
    prompt, output = ids[:1], ids[1:]
    assert sentencepiece_style.decode(output) == "world is wide"  # what naive decoding gives
    detokenizer = IncrementalDetokenizer(sentencepiece_style, prompt)
    assert "".join(stream(detokenizer, output)) == " world is wide"
