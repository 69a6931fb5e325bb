"""The engine's side of structured output: a grammar matcher per request that has one.

The compiler is built on the first request with a grammar (about 0.2 s for a 49k
vocabulary, on the engine's thread, never the event loop) and caches each spec. A request
that arrives with output already sampled (prefill sampled the first token, or a migration
replays earlier attempts' tokens) starts its matcher past those tokens.
"""

from __future__ import annotations

from collections.abc import Collection

from shared.engine.sequence import Sequence
from shared.errors import InvalidRequest
from shared.model.tokenizer import Tokenizer
from shared.structured.compiler import LazyGrammarCompiler
from shared.structured.matcher import GrammarMatcher


class Grammars:
    def __init__(self, tokenizer: Tokenizer | None, stop_ids: Collection[int], mock: bool) -> None:
        # NOTE: the mock engine follows no logits, so it cannot follow a grammar either
        self._compiler = None
        if tokenizer is not None and not mock:
            self._compiler = LazyGrammarCompiler(tokenizer, sorted(stop_ids))

    def matcher(self, seq: Sequence) -> GrammarMatcher | None:
        """`seq`'s matcher, past its output so far; None when it has no grammar."""
        spec = seq.params.grammar
        if spec is None:
            return None
        if self._compiler is None:
            raise InvalidRequest(
                "structured output needs a real model with a tokenizer; "
                "the mock engine cannot follow a grammar"
            )
        output = seq.token_ids[seq.num_tokens - seq.num_output_with_prior :]
        return self._compiler.get().matcher(spec, output)
