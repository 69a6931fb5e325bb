"""`kvstack generate`: one prompt through the engine in this process."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

import orjson

from shared.engine.config import (
    ACTIVATIONS_CHOICES,
    ATTENTION_CHOICES,
    DECODE_BURST,
    DTYPE_CHOICES,
    WEIGHTS_CHOICES,
    EngineConfig,
)
from shared.engine.output import Completion
from shared.errors import InvalidRequest, KvstackError
from shared.model.registry import DEFAULT_MODEL
from shared.sampling_params import SamplingParams

if TYPE_CHECKING:
    from shared.engine.interface import EngineInterface


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate text for one prompt in this process")
    p.add_argument("--model", default=DEFAULT_MODEL, help="known name, HF directory or .gguf")
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="prompt text")
    prompt.add_argument("--prompt-ids", help="prompt as comma-separated token ids")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (the default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--logprobs", type=int, default=None, help="top alternatives per token")
    p.add_argument(
        "--dtype",
        choices=DTYPE_CHOICES,
        default="auto",
        help="auto: bfloat16 on CPUs with native bf16 (AMX/AVX512-BF16), else float32",
    )
    p.add_argument(
        "--weights",
        choices=WEIGHTS_CHOICES,
        default="auto",
        help="auto: a GGUF file's quantized blocks as they are (CPU); float: dequantized to "
        "--dtype; q8_0, q4_0, q4_1: re-quantized at load",
    )
    p.add_argument(
        "--device", default="auto", help="auto (CUDA where torch sees it), cpu, cuda or cuda:N"
    )
    p.add_argument(
        "--attention",
        choices=ATTENTION_CHOICES,
        default="auto",
        help="auto: Triton on a GPU, the native CPU kernels elsewhere",
    )
    p.add_argument(
        "--activations",
        choices=ACTIVATIONS_CHOICES,
        default="q16",
        help="of quantized weights: q16 or q8 (rounded to 16 or 8 bits, integer dot products; "
        "q8 as llama.cpp), or float",
    )
    p.add_argument(
        "--no-fused-decode",
        action="store_true",
        help="decode layer by layer through the model's modules, not one native call a step",
    )
    p.add_argument(
        "--decode-burst",
        type=int,
        default=DECODE_BURST,
        help="greedy decode steps chained in one native call (1: a token a step)",
    )
    p.add_argument(
        "--no-cuda-graphs",
        action="store_true",
        help="on a GPU, decode eagerly instead of replaying CUDA graphs",
    )
    p.add_argument("--threads", type=int, default=None, help="torch threads")
    p.add_argument("--json", action="store_true", help="print ids, text and logprobs as JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    # NOTE: everything the flags alone can get wrong is checked before torch loads (seconds)
    config = EngineConfig(
        model=args.model,
        dtype=args.dtype,
        weights=args.weights,
        device=args.device,
        attention=args.attention,
        activations=args.activations,
        fused_decode=not args.no_fused_decode,
        decode_burst=args.decode_burst,
        cuda_graphs=not args.no_cuda_graphs,
        num_threads=args.threads,
    )
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        stop=tuple(args.stop),
        ignore_eos=args.ignore_eos,
        logprobs=args.logprobs if args.logprobs is not None else (0 if args.json else None),
    )
    given_ids = given_token_ids(args)
    from shared.engine.engine import LLMEngine  # torch: only the command that computes loads it

    engine: EngineInterface = LLMEngine(config)
    prompt_ids = given_ids if given_ids is not None else text_token_ids(engine, args)
    engine.add_request("generate", prompt_ids, params)
    completion = Completion("generate", prompt_ids, [], "", None, None)
    while engine.has_unfinished:
        for out in engine.step():
            completion.add(out)
            if not args.json:
                print(out.new_text, end="", flush=True)
    print(orjson.dumps(as_json(args, completion)).decode() if args.json else "")
    return 0


def given_token_ids(args: argparse.Namespace) -> list[int] | None:
    """--prompt-ids, parsed; None where the prompt is text (the model's tokenizer's)."""
    if args.prompt_ids is None:
        return None
    if args.chat:
        raise KvstackError("--chat needs --prompt text, not --prompt-ids")
    return parse_ids(args.prompt_ids)


def text_token_ids(engine: EngineInterface, args: argparse.Namespace) -> list[int]:
    tokenizer = engine.info.tokenizer
    if tokenizer is None:
        raise KvstackError(f"{engine.info.model_dir} has no tokenizer.json; use --prompt-ids")
    if args.chat:
        return tokenizer.encode_chat([{"role": "user", "content": args.prompt}])
    return tokenizer.encode(args.prompt)


def parse_ids(text: str) -> list[int]:
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts or not all(part.lstrip("-").isdigit() for part in parts):
        raise InvalidRequest(f"--prompt-ids must be comma-separated integers, got {text!r}")
    return [int(part) for part in parts]


def as_json(args: argparse.Namespace, completion: Completion) -> dict:
    logprobs = [
        {"token_id": lp.token_id, "logprob": lp.logprob, "top": lp.top}
        for lp in completion.logprobs or ()
    ]
    return {
        "model": args.model,
        "prompt": args.prompt,
        "prompt_token_ids": completion.prompt_token_ids,
        "token_ids": completion.token_ids,
        "text": completion.text,
        "finish_reason": completion.finish_reason,
        "logprobs": logprobs,
    }
