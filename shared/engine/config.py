"""Engine configuration: model, precision, KV cache size and batching limits."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from shared.engine.mock import MockSpec
from shared.errors import KvstackError, ModelNotFound
from shared.model.registry import gguf_source

# The dtypes an engine computes in, by torch's names (torch loads only where a model runs:
# the gateway reads this config without it).
DTYPES = ("float32", "bfloat16", "float16")
DTYPE_CHOICES = ("auto", *DTYPES)
# How linear weights are held: "auto" keeps a GGUF file's quantized blocks on CPU (float
# elsewhere), "float" dequantizes them to `dtype`, a format re-quantizes float weights at load.
QUANT_FORMATS = ("q8_0", "q4_0", "q4_1")
WEIGHTS_CHOICES = ("auto", "float", *QUANT_FORMATS)
# Attention kernels: "auto" is Triton on a GPU (where Triton is installed), torch's and the
# native CPU kernels elsewhere; "triton" forces the Triton kernels (on CPU: interpreter only).
ATTENTION_CHOICES = ("auto", "torch", "triton")


# What the CLI's --decode-burst defaults to (EngineConfig.decode_burst: chained greedy decode
# steps). NOTE: 8 gained no more than 4 at batch 1
# (docs/notes/2026-11-30-batch-1-decode-step.md, "Decode steps chained in one native call"), and
# a burst's tokens stream in one event: fewer is smoother.
DECODE_BURST = 4


def check_choice(label: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise KvstackError(f"unknown {label} {value!r}; choose from {', '.join(choices)}")


def check_device(name: str) -> None:
    """A device an engine may run on ("auto": the engine resolves it, shared/engine/device.py)."""
    if name in ("auto", "cpu", "cuda") or (name.startswith("cuda:") and name[5:].isdigit()):
        return
    raise KvstackError(f"unknown device {name!r}; choose auto, cpu, cuda or cuda:N")


# How quantized weights take a decode step's activations (shared/model/quant.py): "q8" rounds
# them to 8 bits per block of 32 and multiplies in integers (as llama.cpp), "q16" to 16 bits
# (finer than bfloat16), "float" as they are.
# NOTE: with q8 or q16, prefill's many rows (the float GEMM) are rounded the same way, so a
# request prefilled again (moved to another worker, preempted) continues as one that decoded.
# q16 is the default: float32's perplexity to three decimals and 1.3x float's decode on an
# AVX2-only CPU (`python -m bench quant`, docs/benchmarks.md). q8 is not: 96.5% greedy
# agreement, and tests/e2e/test_isolation.py's greedy answers through the stack differ from
# an in-process engine's with it (not understood yet; see docs/benchmarks.md).
ACTIVATIONS_CHOICES = ("q8", "q16", "float")
# What prefill's many-row matmuls read from quantized weights: "quantized" dequantizes the
# blocks on every pass; "bfloat16" and "float32" keep a copy made at load where prompts
# multiply in that dtype (2 or 4 bytes a weight more; decode's GEMV still reads the blocks);
# "auto" keeps one in whatever they multiply in where it is small beside the machine's (or
# container's) memory.
PREFILL_WEIGHTS_CHOICES = ("auto", "quantized", "bfloat16", "float32")
# NOTE: an eighth of memory: SmolLM2's copy (0.2 GB) or a 1B model's (2.5 GB) on a 24 GiB
# machine, never an 8B's (15 GB); the KV cache and the blocks themselves keep the rest.
PREFILL_COPY_MEMORY_SHARE = 1 / 8


def resolve_dtype(name: str, device: str = "cpu", quantized: bool = False) -> str:
    """ "auto" is bfloat16 where the hardware computes it natively, float32 elsewhere, and
    float32 on a CPU whose linear weights stay quantized: their GEMV computes in float32
    whatever the dtype, and a float32 decode step skips the bfloat16 one's conversions
    around it (a few percent more tokens/s: docs/notes/2026-11-26-fused-decode-step.md,
    "`--dtype bfloat16` with quantized weights"), while prefill's matmuls still multiply in
    bfloat16 where the CPU has it (prefill_matmul_dtype). bfloat16 halves the KV cache's
    bytes: `--dtype bfloat16`."""
    if name != "auto":
        return name
    if device.startswith("cuda"):
        return "bfloat16"
    if quantized:
        return "float32"
    return "bfloat16" if cpu_has_native_bf16() else "float32"


def prefill_matmul_dtype(name: str, device: str = "cpu", quantized: bool = False) -> str:
    """The dtype quantized weights multiply many float32 rows (prefill chunks) in: bfloat16
    for `--dtype auto` where the CPU computes it natively (prefill 1.5-1.9x float32's here,
    docs/notes/2026-11-26-fused-decode-step.md, "`--dtype auto` with quantized weights"), else
    the activations' own. `--dtype float32` stays float32 throughout."""
    if name == "auto" and quantized and device == "cpu" and cpu_has_native_bf16():
        return "bfloat16"
    return resolve_dtype(name, device, quantized)


def keeps_prefill_copy(choice: str, copy_dtype: str, copy_bytes: int) -> bool:
    """Whether quantized weights also keep a copy in `copy_dtype` (what prompts multiply in)
    for prefill's matmuls (PREFILL_WEIGHTS_CHOICES): the dtype asked for, or "auto" where the
    copy takes at most PREFILL_COPY_MEMORY_SHARE of the machine's memory."""
    if choice == "auto":
        return copy_bytes <= PREFILL_COPY_MEMORY_SHARE * physical_memory_bytes()
    return choice == copy_dtype


def physical_memory_bytes() -> int:
    """The machine's memory, or the container's where its cgroup allows less (a pod's limit)."""
    machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return min(machine, *cgroup_memory_limits())


# cgroup v2, then v1: where a container's memory limit is read ("max" or a huge v1 value: none)
CGROUP_MEMORY_LIMITS = (
    Path("/sys/fs/cgroup/memory.max"),
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
)


def cgroup_memory_limits(files: tuple[Path, ...] = CGROUP_MEMORY_LIMITS) -> list[int]:
    limits = []
    for path in files:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            limits.append(int(text))
    return limits


def kv_weights(weights: str, activations: str, quantized: bool) -> str:
    """How the weights that compute a KV block are held, for its namespace: "float", or the
    quantized blocks and how they take activations (a Q4_1 model's KV is not a float one's,
    and q8 activations round what float ones do not)."""
    return f"{weights}-{activations}" if quantized else "float"


def keeps_quantized_weights(model: str, weights: str, device: str = "cpu") -> bool:
    """Whether the linear weights stay quantized blocks (as shared/model/quant_loader.py
    loads them, where the native kernels build)."""
    if weights == "float" or device != "cpu":
        return False
    try:
        return weights != "auto" or gguf_source(model) is not None
    except ModelNotFound:  # the loader says so, with what to install
        return False


def cpu_has_native_bf16() -> bool:
    flags = _cpuinfo()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def cpu_has_amx() -> bool:
    """Whether the CPU multiplies bfloat16 on AMX's tiles (Sapphire Rapids and later)."""
    return "amx_bf16" in _cpuinfo()


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


@dataclass(frozen=True)
class EngineConfig:
    model: str = "SmolLM2-135M-Instruct"  # a known name, an HF directory or a .gguf file
    dtype: str = "auto"  # "auto": resolve_dtype
    weights: str = "auto"  # WEIGHTS_CHOICES: "auto" is what the file holds, on CPU
    activations: str = "q16"  # ACTIVATIONS_CHOICES: of quantized weights' GEMV (few rows)
    prefill_weights: str = "auto"  # PREFILL_WEIGHTS_CHOICES: what many rows multiply by
    device: str = "cpu"  # "auto", "cpu", "cuda" or "cuda:N"
    attention: str = "auto"  # ATTENTION_CHOICES
    block_size: int = 16
    kv_cache_bytes: int = 1 << 30  # ignored when num_blocks is set
    num_blocks: int | None = None
    max_model_len: int | None = None  # default: the model's own limit
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 64
    enable_prefix_cache: bool = True
    enable_chunked_prefill: bool = True
    long_prefill_tokens: int | None = None  # a prompt's chunk while others prefill too
    # (SchedulerConfig); None: the default, 0: off
    num_threads: int | None = None  # torch threads for this process
    prefill_threads: int | None = None  # for steps that prefill (None: num_threads)
    detokenize: bool = True  # False: token ids only (the gateway makes text)
    local_kv: bool = True  # False: KV lives elsewhere (attention offload);
    # num_blocks then counts the remote pool's blocks
    fused_decode: bool = True  # a decode-only step's layers in one native call, where it
    # applies (CPU; float32, or bfloat16 with quantized weights: shared/model/fused_decode.py);
    # False: the module path
    # Greedy decode-only steps chained in one native call where every row allows it (no
    # logprobs, penalties or grammar; nobody waiting; the fused step with its head): up to
    # this many tokens a row per engine step, streamed together. 1: a token a step.
    decode_burst: int = 1
    huge_pages: bool = True  # on CPU, the weights moved into one arena in the order a step
    # reads them (shared/model/weight_arena.py) and the KV pool, both in huge pages where the
    # kernel grants them (shared/huge_pages.py); False: as torch allocates them
    cuda_graphs: bool = True  # a decode-only step replayed as a CUDA graph, where it
    # applies (a GPU with Triton attention; shared/engine/cuda_graphs.py); False: eager
    seed: int = 0
    mock: MockSpec | None = None  # no model: the mock engine (shared/engine/mock.py)

    def __post_init__(self) -> None:
        check_choice("dtype", self.dtype, DTYPE_CHOICES)
        check_choice("weights", self.weights, WEIGHTS_CHOICES)
        check_choice("attention", self.attention, ATTENTION_CHOICES)
        check_device(self.device)
        check_choice("activations", self.activations, ACTIVATIONS_CHOICES)
        check_choice("prefill weights", self.prefill_weights, PREFILL_WEIGHTS_CHOICES)
        for name in ("fused_decode", "huge_pages", "cuda_graphs"):
            if not isinstance(getattr(self, name), bool):
                raise KvstackError(f"{name} must be true or false, got {getattr(self, name)!r}")
        positives = (
            "block_size",
            "kv_cache_bytes",
            "max_num_batched_tokens",
            "max_num_seqs",
            "decode_burst",
        )
        for name in positives:
            if getattr(self, name) < 1:
                raise KvstackError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("num_threads", "prefill_threads"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise KvstackError(f"{name} must be at least 1, got {getattr(self, name)}")
        if (self.long_prefill_tokens or 0) < 0:
            raise KvstackError(
                f"long_prefill_tokens must not be negative, got {self.long_prefill_tokens}"
            )

    @property
    def quantized_weights(self) -> bool:
        return self.mock is None and keeps_quantized_weights(self.model, self.weights, self.device)

    @property
    def kv_weights(self) -> str:
        return kv_weights(self.weights, self.activations, self.quantized_weights)

    @property
    def resolved_dtype(self) -> str:
        return resolve_dtype(self.dtype, self.device, self.quantized_weights)

    @property
    def prefill_matmul_dtype(self) -> str:
        return prefill_matmul_dtype(self.dtype, self.device, self.quantized_weights)


def max_model_len(config: EngineConfig, max_positions: int, num_blocks: int) -> int:
    """Prompt plus generated tokens at most: the configured limit, within the model's
    positions and what the KV pool holds."""
    limit = config.max_model_len or max_positions
    return min(limit, max_positions, num_blocks * config.block_size)
