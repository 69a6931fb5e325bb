"""Turn generated token ids into text one token at a time, for streaming.

Decoding a token alone is wrong in two ways: a byte-level token may hold part of a UTF-8
character, and SentencePiece decoders drop the leading space of the first token they see. So,
as vLLM does, each step decodes a short window twice -- from `prefix_offset` up to `read_offset`
(text already emitted) and up to the newest token -- and emits the difference, holding it back
while it ends in an incomplete character.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice

from shared.model.tokenizer import Tokenizer

CONTEXT_TOKENS = 5  # prompt tokens decoded ahead of the output, so the first token has context
REPLACEMENT_CHAR = "\ufffd"  # what decoding yields for an incomplete UTF-8 sequence


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_token_ids: Sequence[int],
        skip_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._skipped = frozenset(tokenizer.all_special_ids if skip_special_tokens else ())
        self._ids = _tail(prompt_token_ids, self._skipped, CONTEXT_TOKENS)
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._text = ""

    @property
    def text(self) -> str:
        """All output text emitted so far."""
        return self._text

    def step(self, token_id: int) -> str:
        """Add one generated token; return the text it completes ("" while held back)."""
        if token_id in self._skipped:
            return ""
        self._ids.append(token_id)
        emitted = self._decode(self._prefix_offset, self._read_offset)
        current = self._decode(self._prefix_offset, len(self._ids))
        if len(current) <= len(emitted) or current.endswith(REPLACEMENT_CHAR):
            return ""
        delta = current[len(emitted) :]
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        self._text += delta
        return delta

    def _decode(self, start: int, end: int) -> str:
        return self._tokenizer.decode(self._ids[start:end], skip_special_tokens=False)


def _tail(ids: Sequence[int], skipped: frozenset[int], count: int) -> list[int]:
    """The last `count` ids that are not skipped, without scanning a long prompt."""
    kept = (token_id for token_id in reversed(ids) if token_id not in skipped)
    return list(islice(kept, count))[::-1]
