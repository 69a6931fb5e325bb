"""How long requests decode: learned from finished requests (RequestDone), per prompt
prefix and overall, for `predictive` (a uniform decode time) and `predictive-request`
(each request's own expected output length)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from shared.messages import RequestDone

SMOOTHING = 0.2  # weight of the newest observation in the moving averages
MAX_PREFIXES = 100_000  # prefixes remembered (least recently seen forgotten first)


def _blend(old: float | None, new: float) -> float:
    return new if old is None else (1 - SMOOTHING) * old + SMOOTHING * new


@dataclass
class OutputLengths:
    default_decode_time: float
    decode_time: float | None = None  # seconds a request spends decoding
    output_tokens: float | None = None  # tokens a request generates
    by_prefix: OrderedDict[int, float] = field(default_factory=OrderedDict)

    def observe(self, done: RequestDone) -> None:
        self.output_tokens = _blend(self.output_tokens, done.num_output_tokens)
        self.decode_time = _blend(self.decode_time, done.num_output_tokens * done.tbt)
        if done.first_block_hash:
            old = self.by_prefix.pop(done.first_block_hash, None)
            self.by_prefix[done.first_block_hash] = _blend(old, done.num_output_tokens)
            if len(self.by_prefix) > MAX_PREFIXES:
                self.by_prefix.popitem(last=False)

    def uniform_decode_time(self) -> float:
        return self.decode_time or self.default_decode_time

    def expected_tokens(self, first_block_hash: int, max_tokens: int) -> float:
        """This request's expected output: what requests with its first block produced,
        else what requests produce overall, never more than its max_tokens."""
        seen = self.by_prefix.get(first_block_hash, self.output_tokens)
        return min(float(max_tokens), seen) if seen is not None else float(max_tokens)
