"""A GrammarSpec compiled once per process, for one tokenizer, by llguidance.

Why llguidance (docs/structured-output.md has the numbers, measured on a 2-core CPU with
SmolLM2's 49,152-token vocabulary): it has no Python dependencies, so the gateway validates a
schema without importing torch (xgrammar imports torch and transformers, about 6 s, and pulls
triton); a schema compiles in 1-2 ms where xgrammar's first took 0.45 s; a mask costs about
20 µs a token (xgrammar about 50 µs). vLLM (the `guidance` backend) and SGLang
(`--grammar-backend llguidance`) both ship it, and it reads JSON schemas, regexes, Lark and
GBNF grammars, and Lark with embedded schemas (how tool calls are constrained).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import llguidance
from llguidance import LLMatcher, LLTokenizer

from shared.errors import InvalidRequest
from shared.model.tokenizer import Tokenizer
from shared.structured.matcher import GrammarMatcher
from shared.structured.spec import CHOICE, GRAMMAR, JSON_OBJECT, JSON_SCHEMA, REGEX, GrammarSpec

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

# NOTE: JSON without free whitespace: a small model otherwise fills it with spaces and newlines
# until max_tokens, and the output never closes.
JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False}
CACHE_SIZE = 256  # distinct specs kept compiled per process


@dataclass(frozen=True)
class CompiledGrammar:
    spec: GrammarSpec
    vocab_size: int  # the tokenizer's; masks are this wide
    initial: LLMatcher  # never advanced: each request starts from a copy of it

    def start(self, token_ids: Sequence[int] = ()) -> GrammarMatcher:
        """A matcher for one request, past `token_ids` (its output so far, when it moved
        from another worker)."""
        matcher = GrammarMatcher(self.initial.deep_copy(), self.vocab_size)
        matcher.replay(token_ids)
        return matcher


class GrammarCompiler:
    """One per process and tokenizer: the gateway checks specs with it, workers mask with it."""

    def __init__(
        self, tokenizer: Tokenizer, stop_token_ids: Sequence[int] = (), cache_size: int = CACHE_SIZE
    ) -> None:
        stops = list(stop_token_ids) or _eos(tokenizer)
        # NOTE: about 0.2 s for a 49k vocabulary; build one compiler per process.
        self._tokenizer = LLTokenizer(tokenizer.to_json(), eos_token=stops)
        self.compile = lru_cache(maxsize=cache_size)(self._compile)

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.vocab_size

    def matcher(self, spec: GrammarSpec, token_ids: Sequence[int] = ()) -> GrammarMatcher:
        return self.compile(spec).start(token_ids)

    def _compile(self, spec: GrammarSpec) -> CompiledGrammar:
        grammar = _engine_grammar(spec)
        error = LLMatcher.validate_grammar(grammar, self._tokenizer)
        if error:
            raise InvalidRequest(f"the {spec.kind} does not compile: {_first_line(error)}")
        initial = LLMatcher(self._tokenizer, grammar, log_level=0)
        return CompiledGrammar(spec, self.vocab_size, initial)


class LazyGrammarCompiler:
    """A GrammarCompiler built on first use (about 0.2 s for a 49k vocabulary: not paid by
    a process that never sees a grammar), once, whichever thread asks first."""

    def __init__(self, tokenizer: Tokenizer, stop_token_ids: Sequence[int] = ()) -> None:
        self._tokenizer = tokenizer
        self._stop_token_ids = tuple(stop_token_ids)
        self._compiler: GrammarCompiler | None = None
        self._lock = threading.Lock()

    def get(self) -> GrammarCompiler:
        with self._lock:
            if self._compiler is None:
                self._compiler = GrammarCompiler(self._tokenizer, self._stop_token_ids)
            return self._compiler


def _eos(tokenizer: Tokenizer) -> list[int]:
    if tokenizer.eos_token_id is None:
        raise InvalidRequest("structured output needs an end-of-sequence token to stop on")
    return [tokenizer.eos_token_id]


def _engine_grammar(spec: GrammarSpec) -> str:
    """llguidance's grammar text for `spec`; InvalidRequest if it cannot even be read."""
    try:
        return ENGINE_GRAMMARS[spec.kind](spec.text)
    except ValueError as exc:
        raise InvalidRequest(f"the {spec.kind} is invalid: {_first_line(str(exc))}") from None


ENGINE_GRAMMARS = {
    JSON_OBJECT: lambda _: LLMatcher.grammar_from_json_schema(
        {"type": "object"}, defaults=JSON_OPTIONS
    ),
    JSON_SCHEMA: lambda text: LLMatcher.grammar_from_json_schema(text, defaults=JSON_OPTIONS),
    REGEX: LLMatcher.grammar_from_regex,
    CHOICE: lambda text: llguidance.grammar_from("choice", text),
    GRAMMAR: lambda text: llguidance.grammar_from("grammar", text),  # Lark, or GBNF converted
}


def _first_line(message: str) -> str:
    return message.strip().splitlines()[0] if message.strip() else "unknown error"
