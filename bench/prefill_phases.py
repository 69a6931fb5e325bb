"""`python -m bench prefill-phases`: where a prompt's prefill time goes, and how fast its
matmuls run beside the same matmuls alone and a large GEMM of their dtype.

Each round the engine prefills one prompt of --prompt-len tokens in one step (max_tokens=1,
no prefix cache), with a timer around each leaf of its layers (the linears, attention with
its KV write, the norms, rotary, SiLU-and-multiply), the embedding, the logits head and
sampling; what no timer covers is the step's own Python and dtype conversions. Then the
linears' rate (2 x tokens x in x out FLOPs each, over their time) beside one layer's linears
run alone on inputs of the prompt's shape, times the layers (their weights hot in cache),
and a square GEMM of --gemm-size in the prompts' matmul dtype: how much of what this
machine's GEMM does the prefill's matmuls reach, and how much of a prefill is not matmuls.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson
import torch
from torch import nn

from bench.gemv import fastest
from bench.step_phases import timed
from shared.engine.config import (
    DTYPE_CHOICES,
    PREFILL_WEIGHTS_CHOICES,
    WEIGHTS_CHOICES,
    EngineConfig,
)
from shared.engine.engine import LLMEngine
from shared.engine.runner import ModelRunner
from shared.errors import KvstackError
from shared.kvcache.manager import cdiv
from shared.model import ops
from shared.model.layers import GatedMLP, Linear, RMSNorm
from shared.model.llama import DecoderLayer
from shared.model.quant import QuantLinear
from shared.model.registry import DEFAULT_MODEL
from shared.sampling_params import SamplingParams

ONCE = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("prefill-phases", help="milliseconds per prompt's prefill, part by part")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto")
    p.add_argument("--weights", choices=WEIGHTS_CHOICES, default="auto")
    p.add_argument("--prefill-weights", choices=PREFILL_WEIGHTS_CHOICES, default="auto")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--rounds", type=int, default=5, help="the median round is reported")
    p.add_argument("--gemm-size", type=int, default=2048, help="the square GEMM's side")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


class Timers:
    """Seconds spent in each part since `spent` was last cleared; `timing` puts the timers
    in place and takes them out again."""

    def __init__(self) -> None:
        self.spent: collections.defaultdict[str, float] = collections.defaultdict(float)
        self._placed: list[tuple[Any, str, Any]] = []

    def wrap(self, owner: Any, name: str, part: str) -> None:
        self._placed.append((owner, name, owner.__dict__.get(name)))
        object.__setattr__(owner, name, timed(getattr(owner, name), self.spent, part))

    def remove(self) -> None:
        for owner, name, own in reversed(self._placed):
            if own is None:  # a method of the class: the instance's timer goes
                object.__delattr__(owner, name)
            else:
                object.__setattr__(owner, name, own)
        self._placed.clear()


@contextmanager
def timing(engine: LLMEngine) -> Iterator[Timers]:
    timers = Timers()
    runner = model_runner(engine)
    model = runner.model
    try:
        for linear in linears_of(model):
            timers.wrap(linear, "forward", "linears")
        for norm in (m for m in model.modules() if isinstance(m, RMSNorm)):
            timers.wrap(norm, "forward", "norms")
            timers.wrap(norm, "add_norm", "norms")
        timers.wrap(runner.backend, "forward", "attention")
        timers.wrap(ops, "rotary_", "rotary")
        timers.wrap(ops, "silu_and_mul", "SiLU and multiply")
        timers.wrap(model, "embed", "embedding")
        timers.wrap(runner, "_logits", "logits head")
        timers.wrap(runner, "sample", "sampling")
        yield timers
    finally:
        timers.remove()


def model_runner(engine: LLMEngine) -> ModelRunner:
    if not isinstance(engine._runner, ModelRunner):
        raise KvstackError("prefill-phases times a model's layers: this engine has none")
    return engine._runner


def build_engine(args: argparse.Namespace) -> LLMEngine:
    torch.set_num_threads(args.threads)
    return LLMEngine(
        EngineConfig(
            model=args.model,
            dtype=args.dtype,
            weights=args.weights,
            prefill_weights=args.prefill_weights,
            num_threads=args.threads,
            enable_prefix_cache=False,
            max_num_seqs=1,
            max_num_batched_tokens=max(2048, args.prompt_len),
            num_blocks=cdiv(args.prompt_len + 16, EngineConfig.block_size),
        )
    )


def prefill_seconds(engine: LLMEngine, prompt: list[int], request_id: str) -> float:
    """One prompt prefilled in one step (its one token sampled)."""
    engine.add_request(request_id, prompt, ONCE)
    start = time.perf_counter()
    outputs = engine.step()
    seconds = time.perf_counter() - start
    if engine.has_unfinished or not (outputs and outputs[0].finished):
        raise KvstackError(f"the {len(prompt)}-token prompt took more than one step")
    return seconds


def linears_of(model: nn.Module) -> list[QuantLinear | Linear]:
    """The layers' linears (not a head: it computes one row, in "logits head")."""
    heads = (getattr(model, "lm_head", None), getattr(model, "embed_tokens", None))
    return [
        m
        for m in model.modules()
        if isinstance(m, (QuantLinear, Linear)) and not any(m is head for head in heads)
    ]


def linear_flops(model: nn.Module, tokens: int) -> float:
    return sum(2.0 * tokens * m.in_features * m.out_features for m in linears_of(model))


def linears_alone_seconds(model: nn.Module, tokens: int, repeats: int = 5) -> float:
    """One layer's linears on inputs as a prefill of `tokens` gives them (the MLP's in its
    matmul dtype), times the layers."""
    layers = [m for m in model.modules() if isinstance(m, DecoderLayer)]
    attn, mlp = layers[0].self_attn, layers[0].mlp
    assert isinstance(mlp, GatedMLP)
    x = torch.randn(tokens, attn.qkv_proj.in_features)
    dtype = mlp.gate_up_proj.matmul_dtype(x)
    attended = torch.randn(tokens, attn.o_proj.in_features)
    hidden = x.to(dtype)
    gated = torch.randn(tokens, mlp.down_proj.in_features).to(dtype)

    def layer() -> None:
        attn.qkv_proj(x), attn.o_proj(attended)
        mlp.gate_up_proj(hidden), mlp.down_proj(gated)

    with torch.inference_mode():
        return fastest([layer], repeats)[0] / 1e6 * len(layers)


def gemm_flops_per_second(size: int, dtype: torch.dtype, repeats: int = 5) -> float:
    a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
    with torch.inference_mode():
        seconds = fastest([lambda: torch.nn.functional.linear(a, b)], repeats)[0] / 1e6
    return 2.0 * size**3 / seconds


def run(args: argparse.Namespace) -> int:
    if args.prompt_len < 1 or args.rounds < 1 or args.gemm_size < 1:
        raise KvstackError("--prompt-len, --rounds and --gemm-size must be positive")
    engine = build_engine(args)
    prompt = [(7 * j) % 1000 + 10 for j in range(args.prompt_len)]
    prefill_seconds(engine, prompt, "warm")
    rounds = []
    with timing(engine) as timers:
        for i in range(args.rounds):
            timers.spent.clear()
            seconds = prefill_seconds(engine, prompt, f"round-{i}")
            rounds.append((seconds, dict(timers.spent)))
    model = model_runner(engine).model
    dtype = getattr(torch, engine._config.prefill_matmul_dtype)
    report = summary(
        args,
        rounds,
        linear_flops(model, args.prompt_len),
        linears_alone_seconds(model, args.prompt_len),
        gemm_flops_per_second(args.gemm_size, dtype),
        str(dtype).removeprefix("torch."),
    )
    print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() if args.json else table(report))
    return 0


def summary(
    args: argparse.Namespace,
    rounds: list[tuple[float, dict[str, float]]],
    flops: float,
    alone_seconds: float,
    gemm_flops: float,
    dtype: str,
) -> dict:
    """The median round (by its time) in milliseconds a prompt."""
    seconds, spent = sorted(rounds, key=lambda r: r[0])[len(rounds) // 2]
    parts = {part: round(s * 1e3, 2) for part, s in spent.items()}
    parts["the step's own Python and conversions"] = round(seconds * 1e3 - sum(parts.values()), 2)
    return {
        "prompt_len": args.prompt_len,
        "threads": args.threads,
        "matmul_dtype": dtype,
        "prefill_ms": round(seconds * 1e3, 2),
        "prefill_tok_s": round(args.prompt_len / seconds, 1),
        "spread_tok_s": [round(args.prompt_len / s, 1) for s, _ in rounds],
        "median_tok_s": round(statistics.median(args.prompt_len / s for s, _ in rounds), 1),
        "parts_ms": dict(sorted(parts.items(), key=lambda kv: -kv[1])),
        "linear_gflop": round(flops / 1e9, 2),
        "linears_gflop_s": round(flops / spent["linears"] / 1e9, 1),
        "linears_alone_ms": round(alone_seconds * 1e3, 2),
        "linears_alone_gflop_s": round(flops / alone_seconds / 1e9, 1),
        "gemm_size": args.gemm_size,
        "gemm_gflop_s": round(gemm_flops / 1e9, 1),
    }


def table(report: dict) -> str:
    total = report["prefill_ms"]
    head = (
        f"prefill {report['prompt_len']} tokens  threads {report['threads']}  matmuls in "
        f"{report['matmul_dtype']}: {report['prefill_tok_s']} tok/s, {total:.1f} ms a prompt "
        f"(rounds: {report['spread_tok_s']} tok/s)"
    )
    lines = [head]
    for part, ms in report["parts_ms"].items():
        rate = f"  ({report['linears_gflop_s']} GFLOP/s)" if part == "linears" else ""
        lines.append(f"  {ms:8.2f} ms  {100 * ms / total:5.1f}%  {part}{rate}")
    lines.append(
        f"the same linears alone (layer 0's on inputs of this shape, times the layers): "
        f"{report['linears_alone_ms']:.2f} ms, {report['linears_alone_gflop_s']} GFLOP/s"
    )
    size = report["gemm_size"]
    lines.append(
        f"a {size} x {size} x {size} GEMM in {report['matmul_dtype']} "
        f"(torch.nn.functional.linear): {report['gemm_gflop_s']} GFLOP/s"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit("run as: python -m bench prefill-phases")
