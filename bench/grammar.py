"""`python -m bench grammar`: what structured output costs in llguidance with the served
model's tokenizer: building the compiler, compiling a spec (first time and cached),
starting a request's matcher, and computing and applying a mask per token."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import TypeVar

import torch

from shared.model.registry import DEFAULT_MODEL, resolve_model
from shared.model.tokenizer import Tokenizer
from shared.structured.compiler import GrammarCompiler
from shared.structured.logits import mask_logits_
from shared.structured.spec import GrammarSpec

T = TypeVar("T")
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "city": {"type": "string"},
        "email": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age", "city", "email", "tags"],
}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("grammar", help="llguidance: compile, matcher and mask costs")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--tokens", type=int, default=200, help="masks timed per run")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    tokenizer = Tokenizer.from_dir(resolve_model(args.model))
    built, compiler = timed(lambda: GrammarCompiler(tokenizer))
    spec = GrammarSpec.json_schema(SCHEMA)
    first, _ = timed(lambda: compiler.compile(spec))
    cached, _ = timed(lambda: compiler.compile(spec))
    started, _ = timed(lambda: compiler.matcher(spec))
    compute, apply = masks(compiler, spec, args.tokens, tokenizer.vocab_size)
    rows = [
        ("compiler (tokenizer set-up)", f"{built * 1e3:.0f} ms"),
        ("compile a 5-property schema, first", f"{first * 1e3:.2f} ms"),
        ("compile it again (cached)", f"{cached * 1e6:.1f} µs"),
        ("a request's matcher", f"{started * 1e6:.1f} µs"),
        ("mask per token, median", f"{compute * 1e6:.1f} µs"),
        ("apply it to a float32 row, median", f"{apply * 1e6:.1f} µs"),
    ]
    print("| step | time |\n| --- | ---: |")
    print("\n".join(f"| {name} | {value} |" for name, value in rows))
    return 0


def masks(
    compiler: GrammarCompiler, spec: GrammarSpec, tokens: int, vocab: int
) -> tuple[float, float]:
    """Median seconds to compute a mask and to apply it, walking the grammar by always
    taking an allowed token (restarting when it completes)."""
    matcher = compiler.matcher(spec)
    row = torch.zeros(vocab)
    computed, applied = [], []
    for _ in range(tokens):
        if matcher.is_finished:
            matcher = compiler.matcher(spec)
        computed.append(timed(matcher.bitmask)[0])
        applied.append(timed(partial(mask_logits_, row.clone(), matcher))[0])
        allowed = matcher.allowed_token_ids()
        matcher.accept(int(allowed[len(allowed) // 2]))
    return statistics.median(computed), statistics.median(applied)


def timed(call: Callable[[], T]) -> tuple[float, T]:
    started = time.perf_counter()
    result = call()
    return time.perf_counter() - started, result
