"""`python -m bench sampling`: what penalties, logit_bias and grammars cost per generated
token, beside plain sampling measured in the same run on the same engine."""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time

import orjson
import torch

from shared.engine.config import DTYPE_CHOICES, EngineConfig
from shared.engine.engine import LLMEngine
from shared.model.registry import DEFAULT_MODEL
from shared.sampling_params import SamplingParams
from shared.structured.request import grammar_from_request
from shared.structured.tool_grammar import tool_call_grammar
from shared.structured.tools import tools_from_request

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 40},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 4},
    },
    "required": ["name", "age", "city", "hobbies"],
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"],
        },
    },
}


def variants(max_tokens: int) -> dict[str, SamplingParams]:
    """What each row samples with; `plain` is the baseline."""
    # NOTE: free text runs to max_tokens (ignore_eos); a grammar ends where it is complete.
    plain = SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=0, ignore_eos=True)
    schema = grammar_from_request(
        {"response_format": {"type": "json_schema", "json_schema": {"schema": PERSON}}}
    )
    tools = tools_from_request({"tools": [WEATHER], "tool_choice": "required"})
    assert tools is not None
    return {
        "plain": plain,
        "penalties": dataclasses.replace(
            plain, presence_penalty=0.5, frequency_penalty=0.5, repetition_penalty=1.2
        ),
        "logit_bias (64 tokens)": dataclasses.replace(
            plain, logit_bias=tuple((t, -5.0) for t in range(1000, 1064))
        ),
        "json_schema": dataclasses.replace(plain, grammar=schema, ignore_eos=False),
        "tool_choice required": dataclasses.replace(
            plain, grammar=tool_call_grammar(tools), ignore_eos=False
        ),
    }


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sampling", help="penalties and grammars: cost per token vs plain")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch-sizes", default="1,8")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    engine = LLMEngine(EngineConfig(model=args.model, dtype=args.dtype, num_threads=args.threads))
    tokenizer = engine.info.tokenizer
    if tokenizer is None:
        raise SystemExit("bench sampling needs a model with a tokenizer")
    prompt = tokenizer.encode_chat(
        [{"role": "user", "content": "Describe a person, then the weather in Paris."}]
    )
    warm = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    engine.generate([prompt], warm)  # kernels, caches and first-run costs out of the way
    rows = []
    for batch in map(int, args.batch_sizes.split(",")):
        plain_ms = None
        for name, params in variants(args.max_tokens).items():
            ms = ms_per_token(engine, [prompt] * batch, params, args.repeats)
            plain_ms = plain_ms or ms
            rows.append({"batch": batch, "sampling": name, "ms_per_token": ms,
                         "vs_plain": ms / plain_ms})  # fmt: skip
            progress(f"batch {batch} {name}: {ms:.2f} ms/token")
    print(orjson.dumps(rows).decode() if args.json else table(rows))
    return 0


def ms_per_token(
    engine: LLMEngine, prompts: list[list[int]], params: SamplingParams, repeats: int
) -> float:
    """Median over repeats of decode time per token after the first: the whole run less
    a run of the first token alone (the same prompts' prefill; a grammar's compile is
    warmed up first), over the tokens after the first."""
    first = dataclasses.replace(params, max_tokens=1)
    engine.generate(prompts[:1], first)
    samples = []
    for _ in range(repeats):
        prefill_s = timed(engine, prompts, first)[0]
        whole_s, results = timed(engine, prompts, params)
        later = sum(len(r.token_ids) - 1 for r in results)
        samples.append((whole_s - prefill_s) * 1000 / max(1, later) * len(prompts))
    return statistics.median(samples)


def timed(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> tuple:
    started = time.perf_counter()
    results = engine.generate(prompts, params)
    return time.perf_counter() - started, results


def table(rows: list[dict]) -> str:
    lines = [
        "| batch | sampling | ms per decode step | vs plain |",
        "| ---: | --- | ---: | ---: |",
    ]
    lines += [
        f"| {r['batch']} | {r['sampling']} | {r['ms_per_token']:.2f} | {r['vs_plain']:.2f}x |"
        for r in rows
    ]
    return "\n".join(lines)


def progress(message: str) -> None:
    print(f"[bench sampling] {message}", file=sys.stderr, flush=True)
