"""`python -m bench decode-profile`: where a decode step's time goes, native code and Python.

The engine decodes a batch in this process while py-spy samples it with native frames
(py-spy is not a dependency: `pip install py-spy`). Only the engine thread's samples count
(its wall time: OpenMP's worker threads spin while idle), each charged to its innermost
frame; the report groups those by where the code lives (kvstack's kernels, the BLAS, the
rest of torch, the Python interpreter) and lists the top frames.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
import torch

from bench.engine import KvstackSide
from shared.engine.config import (
    ACTIVATIONS_CHOICES,
    DTYPE_CHOICES,
    WEIGHTS_CHOICES,
    EngineConfig,
)
from shared.engine.engine import LLMEngine
from shared.errors import KvstackError
from shared.kvcache.manager import cdiv
from shared.model.kernels import chosen_isa
from shared.model.registry import DEFAULT_MODEL

# Where an innermost frame's code lives, first match wins: (group, pattern on the frame).
GROUPS = (
    ("kvstack kernels", re.compile(r"kvstack_cpu_ops")),
    ("BLAS (MKL/oneDNN)", re.compile(r"libmkl|mkl_|sgemv|sgemm|dnnl|libdnnl|gemm", re.I)),
    ("OpenMP runtime", re.compile(r"libgomp|libiomp")),
    ("torch (other ops, dispatch)", re.compile(r"libtorch|libc10")),
    ("Python", re.compile(r"\.py:\d+\)|libpython|python3\.\d+ ")),
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("decode-profile", help="py-spy profile of the engine's decode loop")
    add_engine_arguments(p)
    p.add_argument(
        "--no-fused-decode", action="store_true", help="decode layer by layer (the module path)"
    )
    p.add_argument("--seconds", type=float, default=15.0, help="how long to sample")
    p.add_argument("--rate", type=int, default=250, help="samples per second")
    p.add_argument("--top", type=int, default=12, help="innermost frames to list")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    py_spy = shutil.which("py-spy")
    if py_spy is None:
        raise KvstackError("decode-profile needs py-spy on PATH: pip install py-spy")
    side = warm_side(args, fused_decode=not args.no_fused_decode)
    engine = side.engine
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "profile.txt"
        tokens, seconds = sample_decode(py_spy, args, side, raw)
        report = summarize(raw.read_text(), args.top, thread=os.getpid())
    report.update(
        dtype=engine.info.config.resolved_dtype,
        isa=chosen_isa() if os.environ.get("KVSTACK_CPU_KERNELS", "1") != "0" else "off",
        batch=args.batch,
        decode_tok_s=round(tokens / seconds, 1),
    )
    print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() if args.json else table(report))
    return 0


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    """What warm_side builds and each decode round runs (shared with `bench step-phases`)."""
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto")
    p.add_argument("--weights", choices=WEIGHTS_CHOICES, default="auto")
    p.add_argument("--activations", choices=ACTIVATIONS_CHOICES, default="q16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument(
        "--decode-tokens", type=int, default=256, help="per round (each round prefills anew)"
    )


def warm_side(args: argparse.Namespace, fused_decode: bool = True) -> KvstackSide:
    """An engine as `args` say (model, dtype, weights, activations, threads, batch), no prefix
    cache, on args.threads torch threads, its decode warmed up once."""
    torch.set_num_threads(args.threads)
    engine = LLMEngine(
        EngineConfig(
            model=args.model,
            dtype=args.dtype,
            weights=args.weights,
            activations=args.activations,
            num_threads=args.threads,
            enable_prefix_cache=False,
            max_num_seqs=max(args.batch, 1),
            num_blocks=max(args.batch, 1)
            * cdiv(args.prompt_len + max(args.decode_tokens, 8), EngineConfig.block_size),
            fused_decode=fused_decode,
        )
    )
    side = KvstackSide(engine)
    side.decode_time(args.batch, args.prompt_len, 8)
    return side


def sample_decode(py_spy: str, args, side: KvstackSide, raw: Path) -> tuple[int, float]:
    """Decode batches back to back while py-spy samples this process; (tokens, seconds)."""
    command = [py_spy, "record", "--pid", str(os.getpid()), "--native", "--threads"]
    command += ["--format", "raw"]
    command += ["--rate", str(args.rate), "--duration", str(int(args.seconds))]
    command += ["--output", str(raw)]
    spy = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)  # py-spy attaches
    tokens, seconds = 0, 0.0
    while spy.poll() is None:
        seconds += side.decode_time(args.batch, args.prompt_len, args.decode_tokens)
        tokens += args.batch * (args.decode_tokens - 1)
    if spy.returncode != 0:
        stderr = spy.stderr.read().decode() if spy.stderr else ""
        raise KvstackError(f"py-spy failed ({spy.returncode}): {stderr.strip()[-400:]}")
    return tokens, seconds


def summarize(raw: str, top: int, thread: int) -> dict:
    """py-spy's raw stacks ('thread (id): name;frame;... count') of one thread -> shares by
    group and the top innermost frames."""
    leaves: collections.Counter[str] = collections.Counter()
    for line in raw.splitlines():
        stack, _, samples = line.rpartition(" ")
        if stack and re.match(rf"thread \({thread}\)", stack):
            leaves[stack.rsplit(";", 1)[-1]] += int(samples)
    total = sum(leaves.values()) or 1
    groups: collections.Counter[str] = collections.Counter()
    for frame, count in leaves.items():
        groups[group_of(frame)] += count
    share = lambda count: round(100 * count / total, 1)
    return {
        "samples": total,
        "groups": {name: share(count) for name, count in groups.most_common()},
        "top": [(short(frame), share(count)) for frame, count in leaves.most_common(top)],
    }


def group_of(frame: str) -> str:
    return next((name for name, pattern in GROUPS if pattern.search(frame)), "other native")


def short(frame: str, width: int = 90) -> str:
    """A frame without C++ template and argument noise, at most `width` characters."""
    name = re.sub(r"<[^<>]*>", "", re.sub(r"<[^<>]*>", "", frame))
    name = re.sub(r"\([^()]*\)(?= \()", "", name)
    return name if len(name) <= width else name[: width - 3] + "..."


def table(report: dict) -> str:
    lines = [
        (
            f"decode batch {report['batch']}  {report['dtype']}  kernels {report['isa']}  "
            f"{report['decode_tok_s']} tok/s  ({report['samples']} samples)"
        ),
        "by group:",
        *(f"  {share:5.1f}%  {name}" for name, share in report["groups"].items()),
        "top innermost frames:",
        *(f"  {share:5.1f}%  {frame}" for frame, share in report["top"]),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit("run as: python -m bench decode-profile")
