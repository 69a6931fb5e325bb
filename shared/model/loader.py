"""Build a model and fill it from a Hugging Face safetensors directory.

Checkpoints keep q/k/v and gate/up as separate tensors; the model keeps them fused
(one matmul each), so names are mapped and rows placed at load time.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from shared.errors import ModelNotFound
from shared.model.config import ModelConfig
from shared.model.files import weight_files
from shared.model.llama import LlamaModel, empty_model

IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def load_model(
    model_dir: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> LlamaModel:
    config = ModelConfig.from_dir(model_dir)
    files = weight_files(Path(model_dir))
    model = empty_model(config, device, dtype)
    load_weights(model, files)
    return model.eval().requires_grad_(False)


def load_weights(model: LlamaModel, files: list[Path]) -> None:
    fill_weights(model, _tensors(files))


def fill_weights(model: LlamaModel, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copy checkpoint tensors (by checkpoint name) into the model's parameters; every
    parameter must be filled."""
    params = dict(model.named_parameters())
    unfilled = {name: p.shape[0] for name, p in params.items()}
    for ckpt_name, tensor in tensors:
        if ckpt_name.endswith(IGNORED_SUFFIXES) or _is_tied_head(model, ckpt_name):
            continue
        name, row = param_slot(model.config, ckpt_name)
        if name not in params:
            raise ModelNotFound(f"unexpected weight {ckpt_name!r} in checkpoint")
        params[name].data[row : row + tensor.shape[0]].copy_(tensor)
        unfilled[name] -= tensor.shape[0]
    missing = [name for name, rows in unfilled.items() if rows > 0]
    if missing:
        raise ModelNotFound(f"checkpoint lacks weights: {', '.join(missing[:5])}")


def _tensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not iterable)
                yield name, f.get_tensor(name)


def _is_tied_head(model: LlamaModel, ckpt_name: str) -> bool:
    return model.lm_head is None and ckpt_name == "lm_head.weight"


def param_slot(config: ModelConfig, ckpt_name: str) -> tuple[str, int]:
    """Checkpoint tensor name -> (model parameter name, first row it fills)."""
    name = ckpt_name.removeprefix("model.")
    fused = {
        "self_attn.q_proj": ("self_attn.qkv_proj", 0),
        "self_attn.k_proj": ("self_attn.qkv_proj", config.q_size),
        "self_attn.v_proj": ("self_attn.qkv_proj", config.q_size + config.kv_size),
        "mlp.gate_proj": ("mlp.gate_up_proj", 0),
        "mlp.up_proj": ("mlp.gate_up_proj", config.intermediate_size),
    }
    for part, (fused_part, row) in fused.items():
        if f".{part}." in name:
            return name.replace(part, fused_part), row
    return name, 0
