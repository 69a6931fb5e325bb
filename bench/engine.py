"""`python -m bench engine`: prefill and decode throughput beside transformers' generate."""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import orjson
import torch

from shared.engine.config import (
    ACTIVATIONS_CHOICES,
    DECODE_BURST,
    DTYPE_CHOICES,
    PREFILL_WEIGHTS_CHOICES,
    WEIGHTS_CHOICES,
    EngineConfig,
    resolve_dtype,
)
from shared.engine.device import DEVICE_CHOICES_HELP, resolve_device
from shared.engine.engine import LLMEngine
from shared.errors import KvstackError
from shared.kvcache.manager import cdiv
from shared.model import ops
from shared.model.fused_decode import fused_decode
from shared.model.kernels import chosen_isa, cpu_ops
from shared.model.quant import interleave_rows, set_copy_min_rows
from shared.model.registry import DEFAULT_MODEL
from shared.sampling_params import SamplingParams

# The routing of matmuls before the native GEMV took float32 and small batches: only a
# single bfloat16 row went to it (the "before" column, measured in the same run).
ROUTING_BEFORE = {torch.bfloat16: 1}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("engine", help="engine prefill/decode tokens/s vs transformers")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--device", default="auto", help=DEVICE_CHOICES_HELP)
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto", help="kvstack's dtype")
    p.add_argument(
        "--weights", choices=WEIGHTS_CHOICES, default="auto", help="kvstack's weight format"
    )
    p.add_argument(
        "--activations",
        choices=ACTIVATIONS_CHOICES,
        default=EngineConfig.activations,  # what the stack runs unless told
        help="of kvstack's quantized weights' GEMV (default: the engine's)",
    )
    p.add_argument(
        "--prefill-weights",
        choices=PREFILL_WEIGHTS_CHOICES,
        default="auto",
        help="what kvstack's prompts' matmuls read from quantized weights (EngineConfig)",
    )
    p.add_argument(
        "--before",
        choices=(
            "routing",
            "float-activations",
            "unfused",
            "openmp",
            "no-kv-prefetch",
            "no-gemv-x16",
            "eager",
            "cublas",
            "kv-dtype-attention",
            "torch-prompt-attention",
            "copy-from-10-rows",
            "copy-from-16-rows",
            "copy-rows-unfused",
            "plain-rows",
            "quantized-prefill",
            "small-pages",
            "no-burst",
        ),
        default="routing",
        help="the 'before' column: matmuls routed as before the native GEMV took float32, "
        "a second engine whose quantized weights take float activations, one whose decode "
        "steps run layer by layer (--no-fused-decode), or the same engine with its fused "
        "decode steps' loops on OpenMP instead of their own thread pool, or the same engine "
        "with its decode attention asking for no cached slot ahead, or with its interleaved "
        "GEMVs one group of 8 rows a 256-bit vector (AVX-512 builds), or (on a GPU) a "
        "second engine whose decode steps run eagerly instead of as CUDA graphs, or one "
        "whose every matmul goes to cuBLAS (no Triton GEMV), or a second engine whose "
        "prompts attend in the KV's dtype (float32) rather than their matmuls' (bfloat16) "
        "under torch's kernel, or one whose prompts attend through torch's kernel rather than "
        "the native one, or one whose decode batches of 10-15 rows take the GEMV rather than "
        "the kept bfloat16 copy, or one whose decode batches the copy takes run layer by layer, or "
        "one whose prompts' matmuls dequantize the weights on every pass (--prefill-weights "
        "quantized) rather than reading --prefill-weights' copy, or one whose weights stay where "
        "they loaded and whose KV pool torch allocates, rather than both in huge pages, or one "
        "that decodes a token a step (--decode-burst 1)",
    )
    p.add_argument(
        "--step-thread",
        action="store_true",
        help="step every kvstack engine on a thread of its own, built on the main thread (as "
        "the services did before they built engines where they step them: `bench "
        "engine-thread` compares the placements; default: the main thread)",
    )
    p.add_argument(
        "--baseline-dtypes",
        default=None,
        help="transformers dtypes, comma-separated "
        "(default: float32, its own default, and kvstack's dtype)",
    )
    p.add_argument(
        "--decode-burst",
        type=int,
        default=DECODE_BURST,
        help="kvstack's greedy decode steps chained in one native call (EngineConfig; "
        "`kvstack serve`'s default)",
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prefill-lens", default="512,2048")
    p.add_argument("--batch-sizes", default="1,8,32")
    p.add_argument("--prompt-len", type=int, default=128, help="prompt length for decode runs")
    p.add_argument("--decode-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-baseline", action="store_true", help="skip transformers")
    p.add_argument(
        "--baseline-cache",
        choices=("dynamic", "static"),
        default="dynamic",
        help="transformers' KV cache: its default (dynamic), or static, which on a GPU also "
        "compiles its decoding steps (CUDA graphs): its fastest configuration",
    )
    p.add_argument(
        "--no-routing-baseline",
        action="store_true",
        help="skip kvstack with the matmul routing as before (one bf16 row to the native GEMV)",
    )
    p.add_argument(
        "--copy-min-rows",
        type=int,
        default=None,
        help="kvstack's engine: the decode rows from which quantized layers multiply by their "
        "kept bfloat16 copies (default: shared/model/quant.py's BF16_COPY_MIN_ROWS)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.copy_min_rows is not None and args.copy_min_rows < 1:
        raise KvstackError(f"--copy-min-rows {args.copy_min_rows}: give 1 or more rows")
    torch.set_num_threads(args.threads)
    config = EngineConfig(
        model=args.model,
        device=resolve_device(args.device),
        dtype=args.dtype,
        weights=args.weights,
        activations=args.activations,
        prefill_weights=args.prefill_weights,
        num_threads=args.threads,
        enable_prefix_cache=False,
        max_num_batched_tokens=8192,
        max_num_seqs=256,
        num_blocks=kv_blocks(args),
        decode_burst=args.decode_burst,
    )
    engine = LLMEngine(config)
    if args.copy_min_rows is not None:
        changed(engine, lambda runner: set_copy_min_rows(runner.model, args.copy_min_rows))
    ours = KvstackSide(engine)
    before = before_side(args, config, ours)
    measured: Any = ours  # what the table's kvstack column measures
    if args.step_thread:
        measured, before = StepThread(ours), before and StepThread(before)
    # transformers in float32 and in what kvstack's dtype means for float weights; the
    # table's header says what kvstack really computes in (float32 for quantized on CPU)
    unquantized = resolve_dtype(args.dtype, config.device)
    baseline_dtypes = (
        args.baseline_dtypes or ",".join(dict.fromkeys(["float32", unquantized]))
    ).split(",")
    args.dtype = engine.info.config.resolved_dtype
    theirs = (
        {}
        if args.no_baseline
        else {
            dtype: TransformersSide(engine, dtype, args.baseline_cache) for dtype in baseline_dtypes
        }
    )
    probe = ReadBandwidth(config.device)
    report = measure(args, measured, theirs, before, probe)
    report.update(bandwidth_report(engine, report, args.prompt_len + args.decode_tokens / 2))
    print(
        orjson.dumps(report, option=orjson.OPT_INDENT_2).decode()
        if args.json
        else format_table(report)
    )
    return 0


def measure(args: argparse.Namespace, ours, theirs, before=None, probe=None) -> dict:
    prefill_lens = [int(n) for n in args.prefill_lens.split(",")]
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    rows: dict[str, list[dict]] = {"prefill": [], "decode": []}
    for n in prefill_lens:
        progress(f"prefill {n} tokens")
        rows["prefill"].append(
            row(
                "tokens",
                n,
                lambda side, n=n: side.prefill_rate(n, args.repeats),
                ours,
                theirs,
                before,
            )
        )
    for b in batch_sizes:
        progress(f"decode batch {b}")
        rate = lambda side, b=b: side.decode_rate(
            b, args.prompt_len, args.decode_tokens, args.repeats
        )
        rows["decode"].append(row("batch", b, rate, ours, theirs, before, probe))
    return {
        "model": args.model,
        "device": device_name(args),
        "dtype": args.dtype,
        "baseline_cache": args.baseline_cache,
        "weights": args.weights,
        "activations": args.activations,
        "before": args.before,
        "copy_min_rows": args.copy_min_rows,
        "step_thread": args.step_thread,
        "kernels": chosen_isa() if cpu_ops() is not None else "off",
        "threads": args.threads,
        "prompt_len": args.prompt_len,
        "decode_tokens": args.decode_tokens,
        **rows,
    }


def row(key: str, value: int, rate, ours, theirs: dict, before=None, probe=None) -> dict:
    """One row of the table; with `probe` (ReadBandwidth), the read bandwidth just before and
    just after kvstack's measurement, their mean."""
    read_before = probe.measure() if probe is not None else 0.0
    kvstack = rate(ours)
    result = {key: value, "kvstack_tok_s": round(kvstack, 1), "transformers": {}}
    if probe is not None:
        result["read_gb_s"] = round((read_before + probe.measure()) / 2 / 1e9, 2)
    if before is not None:
        result["before_tok_s"] = round(rate(before), 1)
    for dtype, side in theirs.items():
        baseline = rate(side)
        result["transformers"][dtype] = {
            "tok_s": round(baseline, 1),
            "ratio": round(kvstack / baseline, 2),
        }
    return result


def kv_blocks(args: argparse.Namespace) -> int:
    """KV blocks for the largest decode batch at its full length, or the longest prompt: a
    pool smaller than the batch preempts and queues sequences (the default 1 GiB holds 23k
    float32 tokens of SmolLM2), and the table would report a batch that never ran together."""
    largest = max(int(b) for b in args.batch_sizes.split(","))
    longest = max(int(n) for n in args.prefill_lens.split(","))
    block = EngineConfig.block_size
    return max(
        largest * cdiv(args.prompt_len + args.decode_tokens, block), cdiv(longest + 1, block)
    )


def progress(message: str) -> None:
    print(f"[bench engine] {message}", file=sys.stderr, flush=True)


def random_prompt(n: int, vocab: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(100, vocab, (n,), generator=gen).tolist()


class KvstackSide:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.vocab = engine.info.model.vocab_size
        self.seed = 0

    def prompts(self, batch: int, n: int) -> list[list[int]]:
        self.seed += 1
        return [random_prompt(n, self.vocab, self.seed * 1000 + i) for i in range(batch)]

    def prefill_rate(self, n: int, repeats: int) -> float:
        params = SamplingParams(max_tokens=1, temperature=0)
        self.engine.generate(self.prompts(1, n), params)  # warm-up
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            self.engine.generate(self.prompts(1, n), params)
            times.append(time.perf_counter() - start)
        return n / statistics.median(times)

    def decode_rate(self, batch: int, prompt_len: int, num_tokens: int, repeats: int) -> float:
        self.decode_time(batch, prompt_len, 4)  # warm-up
        times = [self.decode_time(batch, prompt_len, num_tokens) for _ in range(repeats)]
        return batch * (num_tokens - 1) / statistics.median(times)

    def decode_time(self, batch: int, prompt_len: int, num_tokens: int) -> float:
        """Seconds from every request's first token to the last token of all."""
        self.check_fits(batch, prompt_len + num_tokens)
        params = SamplingParams(max_tokens=num_tokens, temperature=0, ignore_eos=True)
        waiting = set()  # for their first token
        for i, prompt in enumerate(self.prompts(batch, prompt_len)):
            self.engine.add_request(f"bench-{self.seed}-{i}", prompt, params)
            waiting.add(f"bench-{self.seed}-{i}")
        while waiting:
            waiting -= {out.request_id for out in self.engine.step()}
        start = time.perf_counter()
        while self.engine.has_unfinished:
            self.engine.step()
        return time.perf_counter() - start

    def check_fits(self, batch: int, num_tokens: int) -> None:
        """Refuses a batch the KV pool cannot hold at its full length: the engine would
        preempt some of it, and the rate would be of a smaller batch than the one named."""
        stats, block_size = self.engine.stats(), self.engine.info.config.block_size
        needed = batch * cdiv(num_tokens, block_size)
        if needed > stats.total_blocks:
            raise KvstackError(
                f"decode batch {batch} of {num_tokens} tokens each needs {needed} KV blocks; "
                f"the pool has {stats.total_blocks} ({stats.total_blocks * block_size} "
                "tokens): a smaller batch or shorter prompts, or a larger pool"
            )


def before_side(args: argparse.Namespace, config: EngineConfig, ours: KvstackSide):
    if args.no_routing_baseline:
        return None
    if args.before == "float-activations":
        return KvstackSide(LLMEngine(dataclasses.replace(config, activations="float")))
    if args.before == "unfused":
        return KvstackSide(LLMEngine(dataclasses.replace(config, fused_decode=False)))
    if args.before == "openmp":
        return KernelSetting(ours, "use_step_pool", False, args.before)
    if args.before == "no-kv-prefetch":
        return KernelSetting(ours, "set_kv_prefetch", 0, args.before)
    if args.before == "no-gemv-x16":
        return KernelSetting(ours, "set_gemv_x16", False, args.before)
    if args.before == "eager":
        return KvstackSide(LLMEngine(dataclasses.replace(config, cuda_graphs=False)))
    if args.before == "kv-dtype-attention":
        return KvstackSide(changed(LLMEngine(config), kv_dtype_attention))
    if args.before == "torch-prompt-attention":
        return KvstackSide(changed(LLMEngine(config), torch_prompt_attention))
    if args.before in ("copy-from-10-rows", "copy-from-16-rows"):
        rows = int(args.before.split("-")[2])
        return KvstackSide(changed(LLMEngine(config), lambda runner: copy_from(runner, rows)))
    if args.before == "copy-rows-unfused":
        return KvstackSide(changed(LLMEngine(config), copy_rows_unfused))
    if args.before == "plain-rows":
        return KvstackSide(changed(LLMEngine(config), plain_rows))
    if args.before == "quantized-prefill":
        return KvstackSide(LLMEngine(dataclasses.replace(config, prefill_weights="quantized")))
    if args.before == "no-burst":
        return KvstackSide(LLMEngine(dataclasses.replace(config, decode_burst=1)))
    if args.before == "small-pages":
        return KvstackSide(LLMEngine(dataclasses.replace(config, huge_pages=False)))
    if args.before == "cublas":  # every matmul to the library: no Triton GEMV
        return RoutingBefore(KvstackSide(LLMEngine(config)), routing={})
    return RoutingBefore(ours)


BEFORE_NOTES = {
    "float-activations": "a second engine, its quantized weights' GEMV on float activations",
    "unfused": "a second engine, its decode steps layer by layer (no fused decode)",
    "cublas": "a second engine, every matmul through cuBLAS (no Triton GEMV)",
    "eager": "a second engine, its decode steps eager (no CUDA graphs)",
    "openmp": "the same engine, its fused decode steps' loops on OpenMP",
    "no-kv-prefetch": "the same engine, its decode attention asking for no slot ahead",
    "no-gemv-x16": "the same engine, its interleaved GEMVs 8 rows a 256-bit vector (no x16)",
    "routing": "the same engine, matmuls routed as before (one bf16 row to the GEMV)",
    "kv-dtype-attention": "a second engine, its prompts attending in the KV's dtype",
    "torch-prompt-attention": "a second engine, its prompts attending through torch's kernel",
    "copy-from-10-rows": "a second engine, its decode batches of 10 rows or more by the bf16 copy",
    "copy-from-16-rows": "a second engine, its decode batches of 16 rows or more by the bf16 copy",
    "copy-rows-unfused": "a second engine, its decode batches the bf16 copy takes layer by layer",
    "plain-rows": "a second engine, its quantized rows in GGUF's order (not interleaved)",
    "quantized-prefill": "a second engine, its prompts' matmuls dequantizing on every pass",
    "small-pages": "a second engine, its weights and KV where torch puts them (no huge pages)",
    "no-burst": "a second engine, its decode a token a step (--decode-burst 1)",
}


def changed(engine: LLMEngine, change: Callable[[Any], None]) -> LLMEngine:
    """The engine with `change` made to its model runner: a "before" column's engine."""

    def apply(runner):
        change(runner)
        return runner

    engine.use_runner(apply)
    return engine


def kv_dtype_attention(runner) -> None:
    """Prompts attend in the KV's dtype (TorchPagedAttention)."""
    runner.backend.prefill_dtype = None


def copy_rows_unfused(runner) -> None:
    """Decode steps that multiply by the kept bfloat16 copies run layer by layer."""
    if runner.fused is not None:
        runner.fused.all_copied = False


def plain_rows(runner) -> None:
    """Quantized rows in GGUF's own order, not interleaved 8 at a time; the fused decode stack
    built again to read them so."""
    interleave_rows(runner.model, False)
    if runner.fused is not None:
        runner.fused = fused_decode(runner.model, runner.backend)


def torch_prompt_attention(runner) -> None:
    """Prompts attend through torch's kernel, not the native one."""
    runner.backend.native_prefill = False


def copy_from(runner, rows: int) -> None:
    """Decode batches of `rows` rows or more by the kept bfloat16 copy, fewer on the GEMV: from
    10 as before the rows were interleaved, from 16 as since (quant.BF16_COPY_MIN_ROWS)."""
    set_copy_min_rows(runner.model, rows)


class StepThread:
    """A side measured on one thread of its own, its engine built on the main thread."""

    def __init__(self, side) -> None:
        self.side = side
        self.thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="engine")

    def prefill_rate(self, n: int, repeats: int) -> float:
        return self.thread.submit(self.side.prefill_rate, n, repeats).result()

    def decode_rate(self, batch: int, prompt_len: int, num_tokens: int, repeats: int) -> float:
        rate = self.side.decode_rate
        return self.thread.submit(rate, batch, prompt_len, num_tokens, repeats).result()


class KernelSetting:
    """The same engine decoding with one of the native kernels' settings changed (`setter`
    returns the old value, put back after): its fused steps' loops on OpenMP, its decode
    attention asking for no slot ahead, or its interleaved GEMVs without group_x16."""

    def __init__(self, side: KvstackSide, setter: str, value: Any, before: str) -> None:
        self.side, self.setter, self.value, self.before = side, setter, value, before

    def prefill_rate(self, n: int, repeats: int) -> float:
        return self.side.prefill_rate(n, repeats)  # decode settings: prefill runs as ours

    def decode_rate(self, batch: int, prompt_len: int, num_tokens: int, repeats: int) -> float:
        native = cpu_ops()
        if native is None:
            raise KvstackError(f"--before {self.before} needs the native kernels")
        setter = getattr(native, self.setter)
        old = setter(self.value)
        try:
            return self.side.decode_rate(batch, prompt_len, num_tokens, repeats)
        finally:
            setter(old)


class RoutingBefore:
    """An engine with its matmuls routed as before (ROUTING_BEFORE, or `routing`). On a
    GPU give it an engine of its own: its CUDA graphs keep the routing they captured."""

    def __init__(self, side: KvstackSide, routing: dict = ROUTING_BEFORE) -> None:
        self.side, self.routing = side, routing

    def prefill_rate(self, n: int, repeats: int) -> float:
        with ops.gemv_rows(self.routing):
            return self.side.prefill_rate(n, repeats)

    def decode_rate(self, batch: int, prompt_len: int, num_tokens: int, repeats: int) -> float:
        with ops.gemv_rows(self.routing):
            return self.side.decode_rate(batch, prompt_len, num_tokens, repeats)


class TransformersSide:
    """The same weights through transformers' `generate` (the reference implementation)."""

    def __init__(self, engine: LLMEngine, dtype: str, cache: str = "dynamic") -> None:
        try:
            import transformers
        except ImportError:
            raise KvstackError(
                "the transformers baseline needs the bench extra "
                "(pip install -e '.[bench]'), or pass --no-baseline"
            ) from None
        self.device = engine.info.config.device
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            engine.info.model_dir, dtype=getattr(torch, dtype), device_map=self.device
        ).eval()
        # NOTE: a static cache is sized by the first (longest) call and kept by later ones,
        # so each batch size compiles once; that is why warm-ups ask for the most tokens.
        self.cache = None if cache == "dynamic" else cache
        self.vocab = engine.info.model.vocab_size
        self.seed = 10_000

    def prefill_rate(self, n: int, repeats: int) -> float:
        self._generate(1, n, 1)
        times = [self._generate(1, n, 1) for _ in range(repeats)]
        return n / statistics.median(times)

    def decode_rate(self, batch: int, prompt_len: int, num_tokens: int, repeats: int) -> float:
        self._generate(batch, prompt_len, num_tokens)
        times = [
            self._generate(batch, prompt_len, num_tokens) - self._generate(batch, prompt_len, 1)
            for _ in range(repeats)
        ]
        return batch * (num_tokens - 1) / statistics.median(times)

    @torch.inference_mode()
    def _generate(self, batch: int, prompt_len: int, num_tokens: int) -> float:
        self.seed += 1
        ids = torch.tensor(
            [random_prompt(prompt_len, self.vocab, self.seed * 1000 + i) for i in range(batch)],
            device=self.device,
        )
        start = time.perf_counter()
        self.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=num_tokens,
            min_new_tokens=num_tokens,
            do_sample=False,
            pad_token_id=0,
            cache_implementation=self.cache,
        )
        synchronize(self.device)
        return time.perf_counter() - start


def read_bandwidth(num_bytes: int = 1 << 30, repeats: int = 5, device: str = "cpu") -> float:
    """Memory read bandwidth in bytes/s: summing a tensor far larger than the caches reads
    every byte once (with the benchmark's threads, as decode reads its weights; on a GPU,
    its memory)."""
    return ReadBandwidth(device, num_bytes).measure(repeats)


class ReadBandwidth:
    """read_bandwidth, its tensor kept for reads beside each decode row.

    NOTE: one read after all rows made each row's share of the limit swing with the machine:
    a shared 2-vCPU VM read 33-57 GB/s minutes apart, and the same ~260 tok/s printed 48% in
    one run and 84% in another (docs/benchmarks.md)."""

    def __init__(self, device: str = "cpu", num_bytes: int = 1 << 30) -> None:
        self.device = device
        self.src = torch.ones(num_bytes // 4, dtype=torch.float32, device=device)
        self.src.sum()

    def measure(self, repeats: int = 5, seconds: float = 1.0) -> float:
        """The fastest of at least `repeats` reads, going on for `seconds`.

        NOTE: for a while after the process idles (a pause, a step's Python) this VM read
        34 GB/s, then 56-58 from the same tensor: the fastest of a second's reads."""
        times: list[float] = []
        until = time.perf_counter() + seconds
        while len(times) < repeats or time.perf_counter() < until:
            synchronize(self.device)
            start = time.perf_counter()
            self.src.sum()
            synchronize(self.device)
            times.append(time.perf_counter() - start)
        return self.src.numel() * 4 / min(times)


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def device_name(args: argparse.Namespace) -> str:
    device = resolve_device(args.device)
    if device.startswith("cuda"):
        return f"{device} ({torch.cuda.get_device_name(device)}, torch {torch.__version__})"
    return device


def bandwidth_report(engine: LLMEngine, report: dict, mean_context: float) -> dict:
    """Each decode row's share of the bandwidth limit: a step reads every weight once and each
    of its B sequences' KV (`mean_context` tokens on average over the run), so B sequences make
    at most B * bandwidth / those bytes tokens/s, bandwidth as read beside that row."""
    weight_bytes = engine.info.weight_bytes
    kv_token_bytes = 2 * engine.info.model.num_layers * engine.kv_storage.token_bytes
    shares_of_limit(report["decode"], weight_bytes, kv_token_bytes, mean_context)
    reads = [r["read_gb_s"] for r in report["decode"]]
    return {
        "weight_bytes": weight_bytes,
        "kv_bytes_per_context_token": kv_token_bytes,
        "mean_context": mean_context,
        "read_bandwidth_gb_s": [min(reads), max(reads)] if reads else [],
    }


def shares_of_limit(
    rows: list[dict], weight_bytes: int, kv_token_bytes: int, mean_context: float
) -> None:
    """Adds each decode row's limit (tokens/s its read bandwidth allows) and share of it."""
    for r in rows:
        step_bytes = weight_bytes + r["batch"] * mean_context * kv_token_bytes
        limit = r["batch"] * r["read_gb_s"] * 1e9 / step_bytes
        r["limit_tok_s"] = round(limit, 1)
        r["share_of_limit"] = round(r["kvstack_tok_s"] / limit, 3)
        if "before_tok_s" in r:
            r["before_share_of_limit"] = round(r["before_tok_s"] / limit, 3)


def format_reads(reads: list[float]) -> str:
    return "-".join(dict.fromkeys(f"{gb_s:.1f}" for gb_s in reads)) or "none"


def format_table(report: dict) -> str:
    baselines = list(report["decode"][0]["transformers"]) if report["decode"] else []
    has_before = bool(report["decode"]) and "before_tok_s" in report["decode"][0]
    header = (f"{'before':>10}{'x':>6}" if has_before else "") + "".join(
        f"{'hf ' + d:>18}{'ratio':>7}" for d in baselines
    )
    lines = [
        (
            f"model {report['model']}  device {report['device']}  threads {report['threads']}  "
            f"kernels {report['kernels']}"
        ),
        (
            f"{'':18}{'kvstack ' + report['dtype'] + ' ' + report['weights']:>18}{header}"
            f"{'% of limit':>12}{'read GB/s':>11}"
        ),
    ]
    for name, key in (("prefill", "tokens"), ("decode", "batch")):
        for r in report[name]:
            cells = (
                f"{r['before_tok_s']:>10}{r['kvstack_tok_s'] / r['before_tok_s']:>6.2f}"
                if has_before
                else ""
            ) + "".join(
                f"{r['transformers'][d]['tok_s']:>18}{r['transformers'][d]['ratio']:>7}"
                for d in baselines
            )
            share = (
                f"{r['share_of_limit']:>12.0%}{r['read_gb_s']:>11.1f}"
                if "share_of_limit" in r
                else ""
            )
            label = f"{name} {key} {r[key]}"
            lines.append(f"{label:18}{r['kvstack_tok_s']:>18}{cells}{share}")
    lines.append(
        f"% of limit: decode tokens/s over batch x the read bandwidth beside the row (read "
        f"before and after it: {format_reads(report['read_bandwidth_gb_s'])} GB/s) / the bytes a "
        "step reads: weights "
        f"({report['weight_bytes'] / 1e6:.0f} MB) + batch x KV of {report['mean_context']:.0f} "
        f"tokens ({report['kv_bytes_per_context_token'] / 1e3:.0f} KB a token)"
    )
    if has_before:
        lines.append(f"before: {BEFORE_NOTES[report['before']]}")
    if report.get("step_thread"):
        lines.append("every kvstack engine stepped on a thread of its own (--step-thread)")
    if report.get("copy_min_rows") is not None:
        lines.append(
            f"kvstack's decode batches by the kept bf16 copies from {report['copy_min_rows']} "
            "rows (--copy-min-rows)"
        )
    return "\n".join(lines)
