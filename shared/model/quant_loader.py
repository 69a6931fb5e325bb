"""Load a model whose linear layers keep quantized weights (QuantLinear).

Two sources: the GGUF file's own blocks (`auto`: what the file holds; tensors of a type the
kernels lack are dequantized, and named once), or float weights re-quantized at load into
one format (`q8_0`, `q4_0`, `q4_1`). Norms stay float; the embedding keeps its rows quantized
and dequantizes the looked-up ones.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch import nn

from shared.errors import ModelNotFound
from shared.model.config import ModelConfig
from shared.model.gguf_convert import hf_tensor_name, unpermute_rotary
from shared.model.gguf_index import TensorEntry, read_tensors
from shared.model.llama import LlamaModel
from shared.model.loader import fill_weights, load_model, param_slot
from shared.model.quant import QuantEmbedding, QuantLinear, has_kernels
from shared.model.quant_formats import FORMATS, QuantFormat, dequantize, format_of, quantize

ROTARY_PARTS = ("attn_q", "attn_k")  # rows llama.cpp permutes for its rope kernel
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
    model = _empty_model(config, dtype)
    linears = dict(_linears(model))
    pieces: dict[str, Pieces] = defaultdict(list)
    floats: list[tuple[str, torch.Tensor]] = []
    for tensor in read_tensors(gguf_path):
        name, fmt = hf_tensor_name(tensor.name), format_of(tensor.ggml_type)
        param, row = param_slot(config, name)
        if fmt is None or param not in linears:
            floats.append((name, _dequantized(tensor, config)))
        else:
            blocks = _rows(tensor, tensor.data, config)
            pieces[param].append((row, fmt, blocks, name))
    float_params = {param_slot(config, name)[0] for name, _ in floats}
    for param, parts in pieces.items():
        formats = {fmt for _, fmt, _, _ in parts}
        if len(formats) == 1 and param not in float_params:
            _swap(model, param, formats.pop(), _concatenated(parts), dtype)
        else:  # a fused weight whose parts differ in format: all float
            floats.extend((name, dequantize(torch.from_numpy(b), f)) for _, f, b, name in parts)
    _log_dequantized(floats)
    fill_weights(model, floats)
    return model.eval().requires_grad_(False)


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


def _empty_model(config: ModelConfig, dtype: torch.dtype) -> LlamaModel:
    # NOTE: untouched float storage of the layers swapped out is never paged in.
    with torch.device("meta"):
        model = LlamaModel(config)
    return model.to_empty(device="cpu").to(dtype)


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


def _log_dequantized(floats: list[tuple[str, torch.Tensor]]) -> None:
    kinds = {name.removeprefix("model.").split(".")[-2] for name, t in floats if t.dim() == 2}
    if kinds:
        _log(f"no kernel for the format of {', '.join(sorted(kinds))}: dequantized to float")


def _log(message: str) -> None:
    print(f"kvstack: {message}", file=sys.stderr, flush=True)
