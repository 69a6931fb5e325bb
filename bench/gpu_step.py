"""`python -m bench gpu-step`: where a decode step's time goes on a GPU.

For each batch size: the engine's whole step (scheduling, staging, the graph, sampling,
outputs), the CUDA graph's replay alone (the GPU's share), and then one eager step under
torch's profiler, its kernels grouped by name with their GPU time: what a graph replays.
"""

from __future__ import annotations

import argparse
import time

import torch

from shared.engine.config import DTYPE_CHOICES, EngineConfig
from shared.engine.engine import LLMEngine
from shared.errors import KvstackError
from shared.model.registry import DEFAULT_MODEL
from shared.sampling_params import SamplingParams


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gpu-step", help="a GPU decode step: engine, graph replay, kernels")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="bfloat16")
    p.add_argument("--batch-sizes", default="1,32")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=50, help="timed steps per batch size")
    p.add_argument("--top", type=int, default=12, help="kernels to list")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if not args.device.startswith("cuda") or not torch.cuda.is_available():
        raise KvstackError("bench gpu-step needs a CUDA device (--device cuda[:N])")
    print(f"model {args.model}  {torch.cuda.get_device_name(args.device)}  {args.dtype}")
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        engine = make_engine(args, cuda_graphs=True)
        step, replay = step_and_replay(engine, batch, args.prompt_len, args.steps)
        print(
            f"batch {batch:>4}: engine step {step * 1e3:.3f} ms, graph replay alone "
            f"{replay * 1e3:.3f} ms, the rest (host) {(step - replay) * 1e3:.3f} ms"
        )
    print(kernel_table(make_engine(args, cuda_graphs=False), args.prompt_len, args.top))
    return 0


def make_engine(args: argparse.Namespace, cuda_graphs: bool) -> LLMEngine:
    config = EngineConfig(
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        enable_prefix_cache=False,
        max_num_seqs=256,
        max_num_batched_tokens=8192,
        cuda_graphs=cuda_graphs,
    )
    return LLMEngine(config)


def decoding(engine: LLMEngine, batch: int, prompt_len: int) -> None:
    """`batch` requests past their prefill, decoding (long enough for any timing)."""
    params = SamplingParams(max_tokens=100_000, temperature=0, ignore_eos=True)
    for i in range(batch):
        engine.add_request(
            f"gpu-step-{i}", [100 + (i + t) % 1000 for t in range(prompt_len)], params
        )
    for _ in range(4):  # the prefill, then the first decode steps (graph capture)
        engine.step()


def step_and_replay(engine: LLMEngine, batch: int, prompt_len: int, steps: int):
    decoding(engine, batch, prompt_len)
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    step = (time.perf_counter() - start) / steps
    graphs = engine._runner.graphs
    if graphs is None:
        raise KvstackError("this engine replays no CUDA graphs (the Triton backend is needed)")
    bucket = next(b for b in graphs.buckets if b >= batch)
    graph = max((key, g) for key, g in graphs.graphs.items() if key[0] == bucket)[1].graph
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        graph.replay()  # the last step's inputs again: the same KV slot, rewritten
    torch.cuda.synchronize()
    return step, (time.perf_counter() - start) / steps


def kernel_table(engine: LLMEngine, prompt_len: int, top: int) -> str:
    from torch.profiler import ProfilerActivity, profile

    decoding(engine, 1, prompt_len)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        engine.step()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    total: dict[str, list[float]] = {}
    for event in kernels:
        total.setdefault(event.name, []).append(event.device_time)
    rows = sorted(total.items(), key=lambda item: -sum(item[1]))[:top]
    busy = sum(e.device_time for e in kernels)
    lines = [
        f"one eager decode step, batch 1: {len(kernels)} kernels and copies, {busy:.0f} us",
        f"{'us':>8}{'calls':>7}{'us each':>9}  kernel",
    ]
    for name, times in rows:
        lines.append(
            f"{sum(times):>8.0f}{len(times):>7}{sum(times) / len(times):>9.1f}  {name[:70]}"
        )
    return "\n".join(lines)
