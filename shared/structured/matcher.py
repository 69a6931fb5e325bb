"""One request's place in its grammar: which tokens may come next, advanced token by token."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from llguidance import LLMatcher

from shared.errors import KvstackError


class GrammarViolation(KvstackError):
    """A token the grammar does not allow: a sampler that skipped the mask, or a history
    replayed against another grammar."""


class GrammarMatcher:
    def __init__(self, matcher: LLMatcher, vocab_size: int) -> None:
        self._matcher = matcher
        self.vocab_size = vocab_size  # the tokenizer's; a model's logits may be wider
        self.num_tokens = 0  # accepted so far
        self._bitmask = np.zeros((vocab_size + 31) // 32, dtype=np.int32)

    def bitmask(self) -> np.ndarray:
        """int32 words, bit j of word w set when token 32*w + j may come next. A view of a
        buffer this matcher reuses: read it before the next call."""
        self._matcher.unsafe_compute_mask_ptr(self._bitmask.ctypes.data, self._bitmask.nbytes)
        return self._bitmask

    def allowed_token_ids(self) -> np.ndarray:
        bits = np.unpackbits(self.bitmask().view(np.uint8), bitorder="little")
        return np.flatnonzero(bits[: self.vocab_size])

    def accept(self, token_id: int) -> None:
        if not self._matcher.consume_token(token_id):
            raise GrammarViolation(
                f"token {token_id} breaks the grammar after {self.num_tokens} tokens: "
                f"{self._matcher.get_error()}"
            )
        self.num_tokens += 1

    def replay(self, token_ids: Sequence[int]) -> None:
        """Advance past tokens already sampled (elsewhere): the state is a function of them."""
        for token_id in token_ids:
            self.accept(token_id)

    @property
    def is_finished(self) -> bool:
        """The grammar is complete and admits nothing more: only an end-of-sequence token
        may follow (the mask allows nothing else), or one was already accepted."""
        return self._matcher.is_stopped()

    @property
    def can_stop(self) -> bool:
        """The output so far is a complete match (it may still go on, as `a+` may)."""
        return self._matcher.is_accepting()
