"""Generated token ids -> the text a client may see, with stop strings applied.

Workers send token ids only; the gateway owns detokenization and stop strings, so a stop
string is cut here, and the caller aborts the backend request once one has matched.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shared.engine.stop import StopStringMatcher
from shared.logprob import TokenLogprob
from shared.model.detokenizer import IncrementalDetokenizer
from shared.model.tokenizer import Tokenizer
from shared.sampling_params import SamplingParams


@dataclass(frozen=True)
class TextUpdate:
    """What one `push` adds to the reply."""

    text: str  # may be "" while text is held back
    token_ids: tuple[int, ...]  # the pushed tokens that belong to the output
    logprobs: tuple[TokenLogprob, ...] | None  # one per token in token_ids, when sent
    text_offset: int  # characters of reply text before `text`
    stopped: bool  # a stop string has ended the reply

    @property
    def empty(self) -> bool:
        return not self.text and not self.token_ids


class TextStream:
    """One request's output text. Not thread-safe; one per request.

    `push` takes tokens in order as workers send them. Once a stop string matches, `stopped`
    is true, the tokens after the one that completed it are dropped, and later pushes return
    empty updates. `num_tokens` counts the output tokens, up to and including that one.
    """

    def __init__(
        self, tokenizer: Tokenizer | None, prompt_token_ids: Sequence[int], params: SamplingParams
    ) -> None:
        self._detokenizer = (
            None
            if tokenizer is None
            else IncrementalDetokenizer(tokenizer, prompt_token_ids, params.skip_special_tokens)
        )
        self._stops = StopStringMatcher(params.stop)
        self._silent_ids = _silent_ids(tokenizer, params)
        self._min_tokens = params.min_tokens
        self.text = ""
        self.num_tokens = 0
        self.stopped = False

    def push(
        self, token_ids: Sequence[int], logprobs: Sequence[TokenLogprob] | None = None
    ) -> TextUpdate:
        text_offset = len(self.text)
        taken, text = self._take(token_ids)
        self.text += text
        kept = None if logprobs is None else tuple(logprobs[:taken])
        return TextUpdate(text, tuple(token_ids[:taken]), kept, text_offset, self.stopped)

    def finish(self) -> str:
        """The text held back as a possible stop-string start; call when the reply ends."""
        rest = self._stops.flush()
        self.text += rest
        return rest

    def _take(self, token_ids: Sequence[int]) -> tuple[int, str]:
        taken, pieces = 0, []
        for token_id in token_ids:
            if self.stopped:
                break
            pieces.append(self._step(token_id))
            taken += 1
        return taken, "".join(pieces)

    def _step(self, token_id: int) -> str:
        self.num_tokens += 1
        if self._detokenizer is None or token_id in self._silent_ids:
            return ""
        # Stop strings count only from min_tokens on (vLLM's rule).
        matching = self.num_tokens >= self._min_tokens
        shown = self._stops.feed(self._detokenizer.step(token_id), matching)
        self.stopped = self._stops.matched is not None
        return shown


def _silent_ids(tokenizer: Tokenizer | None, params: SamplingParams) -> frozenset[int]:
    """Tokens that end a reply without adding text (as in vLLM): stop ids, and EOS."""
    eos = None if tokenizer is None or params.ignore_eos else tokenizer.eos_token_id
    return frozenset(params.stop_token_ids) | ({eos} if eos is not None else set())
