"""Text <-> token ids, and chat prompts, from a model directory's tokenizer files.

Built on the `tokenizers` library and jinja2 alone (never `transformers`, which is slow to
import); chat templates render the way transformers renders them, so prompts match the model's
training format token for token. Control-token text inside messages stays plain text
(`spelled_tokens`), so only the template's own markup yields control tokens.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import cached_property
from pathlib import Path

import jinja2
import jinja2.ext
import tokenizers
from jinja2.sandbox import ImmutableSandboxedEnvironment

from shared.errors import InvalidRequest, ModelNotFound, UnsupportedModel
from shared.model.spelled_tokens import SpelledTokens

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"  # where transformers >= 5 saves the chat template


def has_tokenizer(model_dir: str | Path) -> bool:
    return (Path(model_dir) / TOKENIZER_FILE).is_file()


class Tokenizer:
    has_tokenizer = staticmethod(has_tokenizer)

    def __init__(
        self, backend: tokenizers.Tokenizer, config: dict, chat_template: str | None
    ) -> None:
        self._backend = backend
        self._config = config
        self._chat_template = chat_template

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> Tokenizer:
        model_dir = Path(model_dir)
        if not has_tokenizer(model_dir):
            raise ModelNotFound(
                f"no {TOKENIZER_FILE} in {model_dir}; kvstack needs a fast "
                "(tokenizers library) tokenizer file"
            )
        config_path = model_dir / CONFIG_FILE
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        backend = tokenizers.Tokenizer.from_file(str(model_dir / TOKENIZER_FILE))
        return cls(backend, config, _find_chat_template(model_dir, config))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        _check_messages(messages)
        try:
            return self._compiled_template.render(
                messages=messages,
                tools=None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **self.special_tokens,
            )
        except jinja2.TemplateError as exc:
            raise InvalidRequest(f"chat template rejected the messages: {exc}") from None

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        # NOTE: the template writes any BOS itself; adding it again would double it.
        prompt = self.apply_chat_template(messages, add_generation_prompt)
        marked = self._spelled_tokens.mark(messages)
        if marked == messages:  # no message spells a control token: all of them are markup
            return self.encode(prompt, add_special_tokens=False)
        marked_prompt = self.apply_chat_template(marked, add_generation_prompt)
        return self._spelled_tokens.encode(prompt, marked_prompt)

    def to_json(self) -> str:
        """The tokenizer.json text (the `tokenizers` library's own serialisation), for libraries
        that build their own view of the vocabulary, such as the grammar engine."""
        return self._backend.to_str()

    @property
    def vocab_size(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    @property
    def eos_token_id(self) -> int | None:
        return self._token_id("eos_token")

    @property
    def bos_token_id(self) -> int | None:
        return self._token_id("bos_token")

    @cached_property
    def all_special_ids(self) -> list[int]:
        added = self._backend.get_added_tokens_decoder()
        ids = {index for index, token in added.items() if token.special}
        named = (self._backend.token_to_id(text) for text in self.special_tokens.values())
        return sorted(ids | {index for index in named if index is not None})

    @cached_property
    def special_tokens(self) -> dict[str, str]:
        """`bos_token`, `eos_token`, ... as text, the way chat templates see them."""
        return {
            name: text
            for name, value in self._config.items()
            if name.endswith("_token") and (text := _token_text(value)) is not None
        }

    def _token_id(self, name: str) -> int | None:
        text = self.special_tokens.get(name)
        return None if text is None else self._backend.token_to_id(text)

    @cached_property
    def _spelled_tokens(self) -> SpelledTokens:
        return SpelledTokens(self._backend)

    @cached_property
    def _compiled_template(self) -> jinja2.Template:
        if not self._chat_template:
            raise InvalidRequest(
                "this model has no chat template; send a plain completion prompt instead"
            )
        try:
            return _template_environment().from_string(self._chat_template)
        except jinja2.TemplateSyntaxError as exc:
            raise UnsupportedModel(f"the model's chat template does not compile: {exc}") from None


def _find_chat_template(model_dir: Path, config: dict) -> str | None:
    path = model_dir / TEMPLATE_FILE
    if path.is_file():
        return path.read_text()
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        named = {entry.get("name"): entry.get("template") for entry in template}
        return named.get("default")
    return template


def _token_text(value: str | dict | None) -> str | None:
    # tokenizer_config.json writes a special token as a string or as an AddedToken dict.
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _check_messages(messages: list[dict]) -> None:
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise InvalidRequest("messages must be a list of objects with a role and content")


def _template_environment() -> ImmutableSandboxedEnvironment:
    """The jinja2 set-up transformers renders chat templates with (templates rely on it)."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # NOTE: jinja's own tojson escapes HTML characters, which would change the prompt.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)
