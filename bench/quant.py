"""`python -m bench quant`: the weight formats side by side, beside float32 in the same run.

Accuracy: perplexity and greedy agreement (the share of positions whose most likely next
token is float32's) on a fixed text in the repo, scored in one causal pass; llama.cpp's on
the same GGUF file too where llama-cpp-python is installed (`--llama-cpp-python`). Speed:
batch-1 decode tok/s per format and per ISA build (each ISA in a process of its own, the
formats interleaved within it), and the share of the memory-bandwidth limit for each
format's weight bytes, with read bandwidth measured in the same process. Each quantized
format runs with float activations and with 8-bit ones ("+ q8 act", the integer-dot GEMV);
the accuracy of 8-bit activations is scored with every row through that GEMV, as decode
computes it. llama.cpp decodes the default model's file and each `--llama-cpp-gguf`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import orjson
import torch

from bench.engine import read_bandwidth
from shared.engine.config import QUANT_FORMATS, EngineConfig
from shared.engine.engine import LLMEngine
from shared.model import ops
from shared.model.kernels import ISA_ENV, chosen_isa, cpu_ops, supported_isas
from shared.model.quant import set_activations
from shared.model.quant_loader import load_model_as
from shared.model.registry import DEFAULT_MODEL, gguf_source, resolve_model
from shared.model.scoring import causal_logits, greedy_agreement, perplexity
from shared.model.tokenizer import Tokenizer
from shared.sampling_params import SamplingParams

TEXT = Path(__file__).parent.parent / "docs" / "architecture.md"
WEIGHTS = ("float", "auto", *QUANT_FORMATS)
LLAMA_CPP_PYTHON = "/work/peers/llamacpp-venv/bin/python"
LLAMA_CPP_GGUFS = ("/work/peers/gguf/SmolLM2-135M-Instruct.Q8_0.gguf",)
LLAMA_CPP_SCRIPT = """
import json, sys, numpy as np, llama_cpp
path, ids, threads = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
llm = llama_cpp.Llama(path, n_ctx=len(ids) + 8, logits_all=True, n_threads=threads,
                      n_batch=len(ids), verbose=False)
llm.eval(ids)
np.save(sys.stdout.buffer, np.asarray(llm.scores[: len(ids)], dtype=np.float32))
"""
# Batch-1 decode on the same file: the prompt, then one token at a time (greedy, no sampling
# overhead of its Python API), as our engine decodes; median of `repeats` runs of 63 tokens.
LLAMA_CPP_DECODE = """
import json, statistics, sys, time, llama_cpp
path, prompt = sys.argv[1], json.loads(sys.argv[2])
tokens, threads, repeats = map(int, sys.argv[3:])
llm = llama_cpp.Llama(path, n_ctx=len(prompt) + tokens + 8, n_threads=threads, verbose=False)
rates = []
for _ in range(repeats + 1):
    llm.reset(); llm.eval(prompt)
    start = time.perf_counter()
    for _ in range(tokens - 1):
        llm.eval([int(llm.scores[llm.n_tokens - 1].argmax())])
    rates.append((tokens - 1) / (time.perf_counter() - start))
print(json.dumps(statistics.median(rates[1:])))
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("quant", help="weight formats: accuracy and decode speed vs float32")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--text-tokens", type=int, default=512, help="of docs/architecture.md")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--isas", default=",".join(supported_isas()), help="builds to time")
    p.add_argument("--llama-cpp-python", default=LLAMA_CPP_PYTHON, help="skipped if absent")
    p.add_argument(
        "--llama-cpp-gguf",
        default=",".join(LLAMA_CPP_GGUFS),
        help="more files for llama.cpp to decode (comma-separated; absent ones skipped)",
    )
    p.add_argument("--weights", default=",".join(WEIGHTS), help="formats to score and time")
    p.add_argument(
        "--bf16-attention",
        action="store_true",
        help="also score each format with its prompt attending through the native kernel's "
        "bfloat16 products, as prompts attend under --dtype auto on CPUs with AVX512-BF16 "
        "(where this build has them; the other rows attend through torch's float32 kernel)",
    )
    p.add_argument(
        "--activations", default="float,q8,q16", help="of the quantized formats (float, q8, q16)"
    )
    p.add_argument("--speed-only", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    if args.speed_only:  # a child: this process's ISA only
        print(orjson.dumps(speed(args)).decode())
        return 0
    report: dict = {"accuracy": accuracy(args), "speed": []}
    for isa in filter(None, args.isas.split(",")):
        report["speed"].extend(speed_in_child(args, isa))
    if args.isas:
        report["speed"].extend(llama_cpp_speed(args))
    report["cpu_flags"] = cpu_flags()
    print(orjson.dumps(report).decode() if args.json else tables(report))
    return 0


# ---- accuracy -------------------------------------------------------------------------------
def accuracy(args: argparse.Namespace) -> list[dict]:
    model_dir, gguf = resolve_model(args.model), gguf_source(args.model)
    ids = Tokenizer.from_dir(model_dir).encode(TEXT.read_text())[: args.text_tokens]
    scores = {}
    bf16_attention = args.bf16_attention and bf16_products()
    for weights in ("float", *(w for w in args.weights.split(",") if w != "float")):
        model = load_model_as(weights, model_dir, gguf, torch.float32, "cpu")
        for activations in variants(args, weights):
            # NOTE: every row through the GEMV, as decode computes each token's.
            set_activations(model, activations, max_rows=len(ids))
            name = label(weights, activations)
            scores[name] = causal_logits(model, ids)
            progress(f"scored {name}: perplexity {perplexity(scores[name], ids):.3f}")
            if bf16_attention:
                name = f"{name} + bf16 attention"
                scores[name] = causal_logits(model, ids, attend_in_bf16_products)
                progress(f"scored {name}: perplexity {perplexity(scores[name], ids):.3f}")
    llama = llama_cpp_scores(args, gguf, ids)
    if llama is not None:
        scores["llama.cpp (file)"] = llama
    reference = scores["float"]
    return [
        {
            "weights": name,
            "perplexity": round(perplexity(logits, ids), 4),
            "agreement": round(greedy_agreement(logits, reference), 4),
            "tokens": len(ids),
        }
        for name, logits in scores.items()
    ]


def llama_cpp_scores(args, gguf: Path | None, ids: list[int]) -> torch.Tensor | None:
    if gguf is None or not Path(args.llama_cpp_python).is_file():
        progress(f"llama.cpp reference skipped (no {args.llama_cpp_python} or no GGUF)")
        return None
    argv = [args.llama_cpp_python, "-c", LLAMA_CPP_SCRIPT, str(gguf), orjson.dumps(ids).decode()]
    done = subprocess.run([*argv, str(args.threads)], capture_output=True, timeout=600)
    if done.returncode != 0:
        progress(f"llama.cpp reference skipped: {done.stderr.decode().strip().splitlines()[-1]}")
        return None
    import io

    import numpy as np

    return torch.from_numpy(np.load(io.BytesIO(done.stdout)))


# ---- speed --------------------------------------------------------------------------------
def speed_in_child(args: argparse.Namespace, isa: str) -> list[dict]:
    argv = [sys.executable, "-m", "bench", "quant", "--speed-only", "--model", args.model]
    argv += ["--threads", str(args.threads), "--repeats", str(args.repeats)]
    argv += ["--prompt-tokens", str(args.prompt_tokens), "--max-tokens", str(args.max_tokens)]
    argv += ["--weights", args.weights, "--activations", args.activations]
    progress(f"timing decode with the {isa} kernels")
    env = {**os.environ, ISA_ENV: isa}
    done = subprocess.run(argv, env=env, capture_output=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"bench quant ({isa}) failed: {done.stderr.decode()[-2000:]}")
    return orjson.loads(done.stdout.splitlines()[-1])


def speed(args: argparse.Namespace) -> list[dict]:
    engines = {
        label(weights, activations): LLMEngine(
            EngineConfig(
                model=args.model,
                dtype="float32",
                weights=weights,
                activations=activations,
                num_threads=args.threads,
                num_blocks=64,
            )
        )
        for weights in args.weights.split(",")
        for activations in variants(args, weights)
    }
    prompt = bench_prompt(args.prompt_tokens, vocab_size(args))
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0, ignore_eos=True)
    samples: dict[str, list[float]] = {w: [] for w in engines}
    for engine in engines.values():
        engine.generate([prompt], params)  # warm-up
    for _ in range(args.repeats):
        for weights, engine in engines.items():  # interleaved: drift hits all alike
            samples[weights].append(decode_tok_s(engine, prompt, params))
    bandwidth = read_bandwidth()
    rows = []
    for weights, engine in engines.items():
        tok_s, weight_bytes = statistics.median(samples[weights]), engine.info.weight_bytes
        rows.append(
            {
                "isa": chosen_isa(),
                "weights": weights,
                "decode_tok_s": round(tok_s, 1),
                "weight_mb": round(weight_bytes / 1e6, 1),
                "read_gb_s": round(bandwidth / 1e9, 2),
                "share_of_limit": round(tok_s * weight_bytes / bandwidth, 3),
            }
        )
    return rows


def bf16_products() -> bool:
    native = cpu_ops()
    if native is None or not native.prefill_attention_has_bf16_products():
        progress("--bf16-attention: this build has no bfloat16 dot products: not scored")
        return False
    return True


def attend_in_bf16_products(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """A whole prompt attending as the engine's prompts do in bfloat16 (ops.prefill_attention)."""
    return ops.prefill_attention(q, k, v, q.shape[-1] ** -0.5, None, torch.bfloat16)


def variants(args: argparse.Namespace, weights: str) -> list[str]:
    """The activation precisions to run `weights` with: float weights take float only."""
    return ["float"] if weights == "float" else args.activations.split(",")


def label(weights: str, activations: str) -> str:
    return weights if activations == "float" else f"{weights} + {activations} act"


def decode_tok_s(engine: LLMEngine, prompt: list[int], params: SamplingParams) -> float:
    """Tokens after the first over the whole run less a run of the first token alone."""
    first_s = timed(engine, prompt, dataclasses.replace(params, max_tokens=1))
    whole_s = timed(engine, prompt, params)
    return (params.max_tokens - 1) / (whole_s - first_s)


def timed(engine: LLMEngine, prompt: list[int], params: SamplingParams) -> float:
    start = time.perf_counter()
    engine.generate([prompt], params)
    return time.perf_counter() - start


def llama_cpp_speed(args: argparse.Namespace) -> list[dict]:
    files = [gguf_source(args.model), *map(Path, filter(None, args.llama_cpp_gguf.split(",")))]
    if not Path(args.llama_cpp_python).is_file():
        return []
    return [
        row
        for gguf in files
        if gguf is not None and gguf.is_file()
        for row in llama_cpp_file_speed(args, gguf)
    ]


def llama_cpp_file_speed(args: argparse.Namespace, gguf: Path) -> list[dict]:
    prompt = orjson.dumps(bench_prompt(args.prompt_tokens, vocab_size(args))).decode()
    counts = [args.max_tokens, args.threads, args.repeats]
    argv = [args.llama_cpp_python, "-c", LLAMA_CPP_DECODE, str(gguf), prompt, *map(str, counts)]
    progress(f"timing llama.cpp's decode of {gguf.name}")
    done = subprocess.run(argv, capture_output=True, timeout=1800)
    if done.returncode != 0:
        progress(f"llama.cpp speed skipped: {done.stderr.decode().strip().splitlines()[-1]}")
        return []
    tok_s = float(done.stdout.decode().strip().splitlines()[-1])
    weight_bytes = gguf.stat().st_size
    bandwidth = read_bandwidth()
    return [
        {
            "isa": "llama.cpp",
            "weights": gguf.name,
            "decode_tok_s": round(tok_s, 1),
            "weight_mb": round(weight_bytes / 1e6, 1),
            "read_gb_s": round(bandwidth / 1e9, 2),
            "share_of_limit": round(tok_s * weight_bytes / bandwidth, 3),
        }
    ]


def bench_prompt(num_tokens: int, vocab: int) -> list[int]:
    """Fixed token ids spread over the vocabulary (no special tokens at its ends)."""
    return [(7919 * i) % (vocab - 1000) + 500 for i in range(num_tokens)]


def vocab_size(args: argparse.Namespace) -> int:
    from shared.model.config import ModelConfig

    return ModelConfig.from_dir(resolve_model(args.model)).vocab_size


# ---- report -------------------------------------------------------------------------------
def tables(report: dict) -> str:
    lines = ["| weights | perplexity | greedy agreement with float32 |", "| --- | ---: | ---: |"]
    lines += [
        f"| {r['weights']} | {r['perplexity']:.3f} | {r['agreement']:.1%} |"
        for r in report["accuracy"]
    ]
    lines += ["", f"({report['accuracy'][0]['tokens']} tokens of docs/architecture.md)", ""]
    lines += [
        "| ISA | weights | MB | decode batch 1 tok/s | vs float32 | read GB/s | of limit |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    base = {r["isa"]: r["decode_tok_s"] for r in report["speed"] if r["weights"] == "float"}
    if base:  # llama.cpp's against the best build's float32
        base["llama.cpp"] = next(iter(base.values()))
    # NOTE: without a float row (--weights auto alone) there is nothing to be "vs": a dash
    lines += [
        f"| {r['isa']} | {r['weights']} | {r['weight_mb']:.0f} | {r['decode_tok_s']:.1f} | "
        f"{vs(r['decode_tok_s'], base.get(r['isa']))} | {r['read_gb_s']:.1f} | "
        f"{r['share_of_limit']:.0%} |"
        for r in report["speed"]
    ]
    lines += ["", f"CPU flags: {report['cpu_flags']}"]
    return "\n".join(lines)


def vs(tok_s: float, base: float | None) -> str:
    return "-" if base is None else f"{tok_s / base:.2f}x"


def cpu_flags() -> str:
    wanted = (
        "avx2",
        "fma",
        "f16c",
        "avx512f",
        "avx512bw",
        "avx512vl",
        "avx512_vnni",
        "avx512_bf16",
        "amx_",
    )
    try:
        flags = next(
            line for line in Path("/proc/cpuinfo").read_text().splitlines() if line[:5] == "flags"
        ).split()
    except (OSError, StopIteration):
        return "unknown"
    return " ".join(f for f in flags if f.startswith(wanted))


def progress(message: str) -> None:
    print(f"[bench quant] {message}", file=sys.stderr, flush=True)
