"""Model configuration, read from a Hugging Face `config.json`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from shared.errors import ModelNotFound, UnsupportedModel

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    @classmethod
    def from_hf(cls, hf: dict) -> RopeConfig:
        # transformers >= 5 writes `rope_parameters`; older files `rope_theta` + `rope_scaling`.
        params = dict(hf.get("rope_scaling") or {})
        params.update(hf.get("rope_parameters") or {})
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type not in ROPE_TYPES:
            raise UnsupportedModel(
                f"unsupported rope scaling type {rope_type!r}; supported: {', '.join(ROPE_TYPES)}"
            )
        return cls(
            theta=float(params.get("rope_theta", hf.get("rope_theta", 10000.0))),
            type=rope_type,
            factor=float(params.get("factor", 1.0)),
            low_freq_factor=float(params.get("low_freq_factor", 1.0)),
            high_freq_factor=float(params.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(
                params.get("original_max_position_embeddings", 8192)
            ),
        )


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    rope: RopeConfig
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise UnsupportedModel(
                f"num_attention_heads {self.num_heads} is not a multiple "
                f"of num_key_value_heads {self.num_kv_heads}"
            )

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_hf(cls, hf: dict) -> ModelConfig:
        arch = _architecture(hf)
        if hf.get("hidden_act", "silu") != "silu":
            raise UnsupportedModel(f"unsupported activation {hf['hidden_act']!r}; only silu")
        num_heads = hf["num_attention_heads"]
        return cls(
            architecture=arch,
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=hf.get("num_key_value_heads") or num_heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // num_heads,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=_context_length(arch, hf),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            attention_bias=arch == "Qwen2ForCausalLM" or bool(hf.get("attention_bias", False)),
            rope=RopeConfig.from_hf(hf),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=_token_ids(hf.get("eos_token_id")),
        )

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelConfig:
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise ModelNotFound(f"no config.json in {model_dir}")
        return cls.from_hf(json.loads(path.read_text()))


def _architecture(hf: dict) -> str:
    archs = hf.get("architectures") or []
    by_type = {
        "llama": "LlamaForCausalLM",
        "mistral": "MistralForCausalLM",
        "qwen2": "Qwen2ForCausalLM",
    }
    arch = archs[0] if archs else by_type.get(hf.get("model_type", ""), hf.get("model_type"))
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModel(
            f"unsupported architecture {arch!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    return arch


def _context_length(arch: str, hf: dict) -> int:
    limit = hf.get("max_position_embeddings", 2048)
    window = hf.get("sliding_window")
    uses_window = arch == "MistralForCausalLM" or hf.get("use_sliding_window", False)
    # NOTE: full attention equals sliding-window attention only within the window.
    return min(limit, window) if (window and uses_window) else limit


def _token_ids(value: int | list[int] | None) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, list) else (value,)
