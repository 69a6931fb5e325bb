"""`python -m bench random-model`: a model directory of a known shape with random weights.

GPU machines here cannot download a hub model and the SmolLM2 package is too big to carry
there, so GPU benchmarks build their models from configs: the same shapes (layers, widths,
heads, vocabulary) as the real models, hence the same bytes per step and the same speed.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

# Public configs of the models issue 19 measures (their config.json, shape fields only).
SHAPES: dict[str, dict] = {
    "smollm2-135m": dict(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    ),
    "llama-3.2-1b": dict(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        rope_scaling=dict(
            rope_type="llama3",
            factor=32.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=8192,
        ),
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    ),
}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("random-model", help="a model directory of a known shape, random weights")
    p.add_argument("--shape", choices=sorted(SHAPES), required=True)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("out", type=Path, help="the directory to write (config.json, safetensors)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    write_random_model(args.out, args.shape, args.dtype, args.seed)
    print(f"wrote {args.shape} ({args.dtype}, random weights) to {args.out}")
    return 0


def write_random_model(out: Path, shape: str, dtype: str = "bfloat16", seed: int = 0) -> Path:
    import transformers

    config = transformers.LlamaConfig(**SHAPES[shape])
    torch.manual_seed(seed)
    # NOTE: initialised on a GPU where there is one: a 1B model's init takes a minute on CPU.
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = transformers.LlamaForCausalLM(config).to(getattr(torch, dtype)).eval()
    model.save_pretrained(out)
    return out
