"""Load a model whose linear layers keep quantized weights (QuantLinear).

Two sources: the GGUF file's own blocks (`auto`: what the file holds), or float weights
re-quantized at load into one format (`q8_0`, `q4_0`, `q4_1`). Norms stay float; the
embedding keeps its rows quantized and dequantizes the looked-up ones.

NOTE: under `auto` a fused weight whose parts differ in format, as q, k and v often do, is
held as Q8_0: exactly where its parts are Q8_0, Q5_0 or Q4_0 (whose values Q8_0 holds).
Otherwise, and for a format without a kernel (such as the Q6_K of most Q4_K_M files), the
quantized weight the kernels cannot read as the file has it is re-quantized to Q8_0: finer than the
file's 4-6 bits, so the file's accuracy within Q8_0's rounding, at 8.5 bits a weight where
dequantizing to float32 took 32 (and decode read 3.8x the bytes). Float tensors stay float
but where fused with quantized parts.
"""

from __future__ import annotations

import sys
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch import nn

from shared.errors import ModelNotFound
from shared.model.config import ModelConfig
from shared.model.gguf_convert import hf_tensor_name, unpermute_rotary
from shared.model.gguf_index import TensorEntry, read_tensors
from shared.model.llama import LlamaModel, empty_model
from shared.model.loader import fill_weights, load_model, param_slot
from shared.model.quant import QuantEmbedding, QuantLinear, has_kernels
from shared.model.quant_formats import (
    EXACT_IN_Q8_0,
    FORMATS,
    QuantFormat,
    as_q8_0,
    dequantize,
    format_of,
    quantize,
)

ROTARY_PARTS = ("attn_q", "attn_k")  # rows llama.cpp permutes for its rope kernel
FLOAT_TYPES = (0, 1, 30)  # GGML's F32, F16 and BF16: what the file holds unquantized
FALLBACK = FORMATS["q8_0"]  # what a quantized weight the kernels cannot read becomes
Pieces = list[tuple[int, QuantFormat, np.ndarray, str]]  # (first row, format, blocks, name)


def load_model_as(
    weights: str, model_dir: Path, gguf_path: Path | None, dtype: torch.dtype, device: str
) -> LlamaModel:
    """The model with its linear weights held as `weights` says (EngineConfig.weights)."""
    if weights == "float" or device != "cpu" or (weights == "auto" and gguf_path is None):
        return load_model(model_dir, dtype, device)
    if not has_kernels():
        _log(f"weights {weights!r} need the native CPU kernels; using float weights")
        return load_model(model_dir, dtype, device)
    if weights == "auto" and gguf_path is not None:
        return load_gguf_quantized(model_dir, gguf_path, dtype)
    return load_requantized(model_dir, FORMATS[weights], dtype)


def load_gguf_quantized(model_dir: Path, gguf_path: Path, dtype: torch.dtype) -> LlamaModel:
    """The model of `model_dir` (config) with the weights of `gguf_path`, blocks kept."""
    config = ModelConfig.from_dir(model_dir)
    # NOTE: untouched float storage of the layers swapped out is never paged in
    model = empty_model(config, "cpu", dtype)
    linears = dict(_linears(model))
    pieces: dict[str, Pieces] = defaultdict(list)
    floats: list[tuple[str, torch.Tensor]] = []
    unread: set[str] = set()  # linears with a quantized part no kernel reads
    for tensor in read_tensors(gguf_path):
        name, fmt = hf_tensor_name(tensor.name), format_of(tensor.ggml_type)
        param, row = param_slot(config, name)
        if fmt is None or param not in linears:
            floats.append((name, _dequantized(tensor, config)))
            if param in linears and tensor.ggml_type not in FLOAT_TYPES:
                unread.add(param)
        else:
            blocks = _rows(tensor, tensor.data, config)
            pieces[param].append((row, fmt, blocks, name))
    float_params = {param_slot(config, name)[0] for name, _ in floats}
    widened: set[str] = set()  # fused parts in differing formats, all exactly Q8_0
    for param, parts in pieces.items():
        formats = {fmt for _, fmt, _, _ in parts}
        if len(formats) == 1 and param not in float_params:
            _swap(model, param, formats.pop(), _concatenated(parts), dtype)
            continue
        if param not in float_params and all(_in_fallback(f) for f in formats):
            _swap(model, param, FALLBACK, _concatenated(list(map(_as_fallback, parts))), dtype)
            widened.add(param)
            continue
        unread.add(param)  # parts that differ in format, or beside one no kernel reads
        # NOTE: a copy: the blocks are the file's, memory-mapped read-only
        floats.extend(
            (name, dequantize(torch.from_numpy(np.array(b)), f)) for _, f, b, name in parts
        )
    fill_weights(model, floats)
    requantized = _requantize(model, sorted(unread), dtype)
    kept = [
        name
        for name, t in floats
        if t.dim() == 2 and param_slot(config, name)[0] not in requantized
    ]
    _log_loaded(requantized, widened, kept)
    return model.eval().requires_grad_(False)


def _in_fallback(fmt: QuantFormat) -> bool:
    """Whether FALLBACK holds `fmt`'s values exactly."""
    return fmt is FALLBACK or fmt.name in EXACT_IN_Q8_0


def _as_fallback(part: tuple[int, QuantFormat, np.ndarray, str]):
    row, fmt, blocks, name = part
    if fmt is FALLBACK:
        return part
    return row, FALLBACK, as_q8_0(torch.from_numpy(np.array(blocks)), fmt).numpy(), name


def _requantize(model: LlamaModel, params: list[str], dtype: torch.dtype) -> set[str]:
    """Each of `params` (filled as float) re-quantized to FALLBACK where its rows fit; those."""
    done = set()
    for param in params:
        weight = model.get_parameter(param).float()
        if weight.shape[1] % FALLBACK.block_values == 0:
            _swap(model, param, FALLBACK, quantize(weight, FALLBACK), dtype)
            done.add(param)
    return done


def load_requantized(model_dir: Path, fmt: QuantFormat, dtype: torch.dtype) -> LlamaModel:
    """The float model of `model_dir`, each linear weight (and the embedding) re-quantized."""
    model = load_model(model_dir, torch.float32)
    for param, module in list(_linears(model)):
        weight = module.weight
        if weight.shape[1] % fmt.block_values:
            _log(f"{param}: rows of {weight.shape[1]} do not fit {fmt.name}; kept float")
            continue
        _swap(model, param, fmt, quantize(weight, fmt), dtype)
    return model.to(dtype)


def quantized_layers(model: nn.Module) -> Iterator[QuantLinear]:
    return (m for m in model.modules() if isinstance(m, QuantLinear))


def _linears(model: LlamaModel) -> Iterator[tuple[str, nn.Linear | nn.Embedding]]:
    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            yield f"{name}.weight", module


def _swap(
    model: LlamaModel, param: str, fmt: QuantFormat, blocks: torch.Tensor, dtype: torch.dtype
) -> None:
    path = param.removesuffix(".weight")
    parent_path, _, attr = path.rpartition(".")
    parent, old = model.get_submodule(parent_path), model.get_submodule(path)
    rows = old.num_embeddings if isinstance(old, nn.Embedding) else _linear(old).out_features
    if blocks.shape[0] != rows:
        raise ModelNotFound(f"{param}: {blocks.shape[0]} rows, not {rows}")
    if isinstance(old, nn.Embedding):
        new: QuantLinear = QuantEmbedding(blocks, fmt, old.embedding_dim, dtype)
    else:
        new = QuantLinear(blocks, fmt, _linear(old).in_features, _linear(old).bias)
    setattr(parent, attr, new)


def _linear(module: nn.Module) -> nn.Linear:
    if not isinstance(module, nn.Linear):
        raise TypeError(f"{type(module).__name__} is not a linear layer")
    return module


def _rows(tensor: TensorEntry, array: np.ndarray, config: ModelConfig) -> np.ndarray:
    """A GGUF tensor's rows ([rows, ...], blocks or floats) in Hugging Face order."""
    part = tensor.name.split(".")[-2]
    heads = {"attn_q": config.num_heads, "attn_k": config.num_kv_heads}
    return unpermute_rotary(array, heads[part]) if part in ROTARY_PARTS else array


def _dequantized(tensor: TensorEntry, config: ModelConfig) -> torch.Tensor:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize

    kind = GGMLQuantizationType(tensor.ggml_type)
    array = gguf_dequantize(tensor.data, kind).astype(np.float32).reshape(tensor.shape)
    return torch.from_numpy(np.ascontiguousarray(_rows(tensor, array, config)))


def _concatenated(parts: Pieces) -> torch.Tensor:
    ordered = sorted(parts, key=lambda part: part[0])
    return torch.from_numpy(np.concatenate([blocks for _, _, blocks, _ in ordered]))


def _log_loaded(requantized: set[str], widened: set[str], kept_float: list[str]) -> None:
    """Which layers the file's blocks did not go to as they are, counted by kind."""

    def kinds(names) -> str:
        counts = Counter(name.removeprefix("model.").split(".")[-2] for name in names)
        return ", ".join(f"{kind} x{n}" for kind, n in sorted(counts.items()))

    if requantized:
        _log(
            f"no kernel reads the file's blocks of {kinds(requantized)} (their format, or "
            f"fused parts in differing formats): re-quantized to {FALLBACK.name}"
        )
    if widened:
        _log(f"fused parts in differing formats, held exactly as {FALLBACK.name}: {kinds(widened)}")
    if kept_float:
        _log(f"kept float, as the file or its rows have them: {kinds(kept_float)}")


def _log(message: str) -> None:
    print(f"kvstack: {message}", file=sys.stderr, flush=True)
