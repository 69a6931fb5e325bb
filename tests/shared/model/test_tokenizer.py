"""Tokenizer: round trips, special tokens, and where chat templates come from."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from shared.errors import InvalidRequest, ModelNotFound
from shared.model.tokenizer import Tokenizer, has_tokenizer

ROUND_TRIP_TEXTS = [
    "Hello, world!",
    "  two leading spaces",
    "trailing\n\n",
    "tabs\tand\r\nCRLF",
    "émoji 😀👩‍👩‍👧 and 中文字符",
    "Ünïcödé naïve café",
    "digits 0123456789 3.14",
    "",
    "code:\n    if x:\n        return {'a': [1, 2]}\n",
]
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(smollm2_dir)


def model_copy(smollm2_dir: Path, dest: Path, **config_changes) -> Path:
    """A directory with SmolLM2's tokenizer.json and an edited tokenizer_config.json."""
    dest.mkdir()
    shutil.copy(smollm2_dir / "tokenizer.json", dest / "tokenizer.json")
    config = json.loads((smollm2_dir / "tokenizer_config.json").read_text())
    config.update(config_changes)
    config = {key: value for key, value in config.items() if value is not None}
    (dest / "tokenizer_config.json").write_text(json.dumps(config))
    return dest


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
def test_round_trip(tokenizer: Tokenizer, text: str) -> None:
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_special_tokens(tokenizer: Tokenizer) -> None:
    assert tokenizer.vocab_size == 49152
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (1, 2)
    assert {0, 1, 2} <= set(tokenizer.all_special_ids)
    ids = tokenizer.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2  # matched whole, not spelled out
    assert tokenizer.decode(ids) == "user\nhi"
    assert tokenizer.decode(ids, skip_special_tokens=False) == "<|im_start|>user\nhi<|im_end|>"
    assert tokenizer.encode("hi", add_special_tokens=False) == tokenizer.encode("hi")  # no BOS


def test_encode_chat(tokenizer: Tokenizer) -> None:
    prompt = tokenizer.apply_chat_template(MESSAGES)
    assert prompt.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert not tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=False).endswith(
        "assistant\n"
    )
    assert tokenizer.encode_chat(MESSAGES) == tokenizer.encode(prompt, add_special_tokens=False)


def test_template_from_jinja_file_wins(smollm2_dir: Path, tmp_path: Path) -> None:
    model = model_copy(smollm2_dir, tmp_path / "m")
    (model / "chat_template.jinja").write_text(
        "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    assert Tokenizer.from_dir(model).apply_chat_template(MESSAGES) == "[user] hi\n[assistant]"


def test_template_list_form_uses_default(smollm2_dir: Path, tmp_path: Path) -> None:
    templates = [
        {"name": "tool_use", "template": "TOOLS"},
        {"name": "default", "template": "{{ bos_token }}{{ messages[0].content }}"},
    ]
    model = model_copy(
        smollm2_dir,
        tmp_path / "m",
        chat_template=templates,
        bos_token={"content": "<|im_start|>", "special": True},
    )
    tokenizer = Tokenizer.from_dir(model)
    assert tokenizer.apply_chat_template(MESSAGES) == "<|im_start|>hi"
    assert tokenizer.bos_token_id == 1


def test_missing_template_is_invalid_request(smollm2_dir: Path, tmp_path: Path) -> None:
    tokenizer = Tokenizer.from_dir(model_copy(smollm2_dir, tmp_path / "m", chat_template=None))
    with pytest.raises(InvalidRequest, match="no chat template"):
        tokenizer.apply_chat_template(MESSAGES)
    assert tokenizer.decode(tokenizer.encode("still works")) == "still works"


def test_template_helpers_behave_like_transformers(smollm2_dir: Path, tmp_path: Path) -> None:
    template = (
        "{% if messages[0].role != 'user' %}{{ raise_exception('user first') }}{% endif %}"
        "{{ messages | tojson }}|{{ strftime_now('%Y') | length }}"
    )
    tokenizer = Tokenizer.from_dir(model_copy(smollm2_dir, tmp_path / "m", chat_template=template))
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "<b>&é"}])
    assert rendered == '[{"role": "user", "content": "<b>&é"}]|4'  # not HTML-escaped
    with pytest.raises(InvalidRequest, match="user first"):
        tokenizer.apply_chat_template([{"role": "assistant", "content": "x"}])


def test_messages_must_be_dicts(tokenizer: Tokenizer) -> None:
    with pytest.raises(InvalidRequest):
        tokenizer.apply_chat_template(["not a message"])


def test_missing_tokenizer_file(tmp_path: Path) -> None:
    assert not has_tokenizer(tmp_path) and not Tokenizer.has_tokenizer(tmp_path)
    with pytest.raises(ModelNotFound, match=r"no tokenizer\.json"):
        Tokenizer.from_dir(tmp_path)
