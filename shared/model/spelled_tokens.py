"""Control tokens spelled inside chat messages stay plain text.

A chat template pastes message text into its own markup. Tokenizing the rendered prompt with
added-token parsing would turn `<|im_end|>` typed by a client into the real control token, so a
user could close their own turn and open a system one (prompt injection). In a chat prompt only
the template's own markup may yield added tokens.

How: every added token's text found in the messages is put between two marker characters and the
template renders the marked messages once more; the markers then show where the client's
spellings lie in the prompt. The prompt is tokenized with those spellings as plain text and the
template's tokens as tokens, cut at the same places as a normal encode would cut it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from functools import cached_property

import tokenizers

from shared.errors import InvalidRequest

# NOTE: Unicode noncharacters are reserved for a program's internal use, so no real text needs
# them; prompts that do carry them are refused below rather than misread.
OPEN, CLOSE = "\ufdd0", "\ufdd1"
MARKERS = re.compile(f"[{OPEN}{CLOSE}]")
MARKED = re.compile(f"{OPEN}([^{OPEN}{CLOSE}]*){CLOSE}")
SEPARATOR = OPEN  # stands in for each template token while the plain-text copy encodes

Span = tuple[int, int]


class SpelledTokens:
    """Marks added tokens spelled in chat messages, and encodes prompts keeping them text.

    Safe to share between threads: nothing is changed after it is built (the plain-text copy of
    the tokenizer is built once, on first use, and only read).
    """

    def __init__(self, backend: tokenizers.Tokenizer) -> None:
        self._backend = backend
        added = backend.get_added_tokens_decoder()
        self._added_ids = frozenset(added)
        self._spelling = _any_of(token.content for token in added.values())

    def mark(self, messages: list[dict]) -> list[dict]:
        """A copy of `messages` with every added token's text in it put between markers."""
        return _map_strings(messages, self._mark_text)

    def encode(self, prompt: str, marked_prompt: str) -> list[int]:
        """`prompt`'s ids with the spellings `marked_prompt` marks read as plain text."""
        spelled = _marked_spans(marked_prompt, prompt)
        template = self._template_tokens(prompt, spelled)
        text = _replace_spans(prompt, [span for span, _ in template], SEPARATOR)
        plain, separator_id = self._plain_text_copy
        template_ids = iter([token_id for _, token_id in template])
        return [
            next(template_ids) if token_id == separator_id else token_id
            for token_id in plain.encode(text, add_special_tokens=False).ids
        ]

    def _mark_text(self, text: str) -> str:
        return self._spelling.sub(lambda spelled: OPEN + spelled.group() + CLOSE, text)

    def _template_tokens(self, prompt: str, spelled: list[Span]) -> list[tuple[Span, int]]:
        """The added tokens a normal encode finds in `prompt`, less those the client spelled."""
        encoding = self._backend.encode(prompt, add_special_tokens=False)
        return [
            (span, token_id)
            for token_id, span in zip(encoding.ids, encoding.offsets)
            if token_id in self._added_ids and not _overlaps(span, spelled)
        ]

    @cached_property
    def _plain_text_copy(self) -> tuple[tokenizers.Tokenizer, int]:
        """A copy reading every added token's text as text, plus a separator token and its id.

        A separator is an added token, so the text either side of it is cut and pre-tokenized
        exactly as beside the template token it replaces (SentencePiece's word-start mark, for
        one, depends on that).
        """
        config = json.loads(self._backend.to_str())
        for token in config["added_tokens"]:
            token["special"] = True  # encode_special_tokens=True skips special tokens only
        plain = tokenizers.Tokenizer.from_str(json.dumps(config))
        plain.encode_special_tokens = True
        plain.add_tokens([tokenizers.AddedToken(SEPARATOR, normalized=False)])
        separator = plain.token_to_id(SEPARATOR)
        if separator is None:
            raise RuntimeError("the separator token was not added to the tokenizer")
        return plain, separator


def _any_of(texts: Iterable[str]) -> re.Pattern:
    # Longest first, so that a token whose text starts another's is not matched in its place.
    alternatives = sorted({text for text in texts if text}, key=len, reverse=True)
    return re.compile("|".join(map(re.escape, alternatives)) or "(?!)")


def _map_strings(value, change: Callable[[str], str]):
    """`value` with `change` applied to every string in it, dict keys included."""
    if isinstance(value, str):
        return change(value)
    if isinstance(value, dict):
        return {_map_strings(k, change): _map_strings(v, change) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_map_strings(item, change) for item in value)
    return value


def _marked_spans(marked: str, prompt: str) -> list[Span]:
    """Where `marked`'s marked stretches lie in `prompt`, which is `marked` unmarked."""
    if MARKERS.search(prompt):
        raise InvalidRequest(
            "message text may not contain the noncharacters U+FDD0 or U+FDD1 "
            "together with the text of one of the model's control tokens"
        )
    # NOTE: a template that cuts or reorders a message's text can lose a marker or move text out
    # of the marks; the unmarked render then differs from the prompt, and nothing is guessed.
    if MARKED.sub(r"\1", marked) != prompt:
        raise InvalidRequest(
            "a message contains the text of one of the model's control tokens "
            "where the chat template rewrites it, so it cannot be kept as plain "
            "text"
        )
    spans = []
    for count, pair in enumerate(MARKED.finditer(marked)):
        start = pair.start() - 2 * count  # two markers gone for every pair before this one
        spans.append((start, start + len(pair.group(1))))
    return spans


def _overlaps(span: Span, spans: list[Span]) -> bool:
    return any(span[0] < end and start < span[1] for start, end in spans)


def _replace_spans(text: str, spans: list[Span], replacement: str) -> str:
    pieces, position = [], 0
    for start, end in spans:
        pieces += [text[position:start], replacement]
        position = end
    return "".join(pieces) + text[position:]
